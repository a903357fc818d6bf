"""Pictures of played episodes: `trl-collm play --render DIR` replays each transcript in a fresh environment and saves
the world after every turn as a PNG (the building game: `BuildingEnv.render_png`)."""

from __future__ import annotations

import math
import os

from ..tasks import call_with_supported


def render_transcripts(
    task, options: dict, rows: list[dict], transcripts: list[dict], agent_names: list[str], out_dir: str
) -> list[str]:
    """Replay every episode turn by turn from its recorded answers and write
    `<out_dir>/episode_<e>_turn_<t>.png` (turn 0: the empty world before the first answers). The environment is
    deterministic given the answers, so the replay is the episode that was played; a replayed reward that differs
    from the recorded one raises."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for tr in transcripts:
        e = tr["episode"]
        env = call_with_supported(task.make_env, **options)
        env.reset(rows[e])
        paths.append(
            env.render_png(
                os.path.join(out_dir, f"episode_{e}_turn_0.png"), title=f"{_target_name(env)}: start (episode {e})"
            )
        )
        for turn in tr["turns"]:
            step = env.step([turn["agents"][a]["completion"] for a in agent_names])
            got = step.reward if isinstance(step.reward, (list, tuple)) else [step.reward] * len(agent_names)
            same = [math.isclose(float(g), float(w), rel_tol=1e-5, abs_tol=1e-6) for g, w in zip(got, turn["reward"])]
            if not all(same):
                raise RuntimeError(
                    f"replaying episode {e} turn {turn['turn']} gave reward {got}, the episode had "
                    f"{turn['reward']}: the environment is not deterministic, so it cannot be re-drawn"
                )
            paths.append(env.render_png(os.path.join(out_dir, f"episode_{e}_turn_{turn['turn'] + 1}.png")))
            if step.done:
                break
    return paths


def _target_name(env) -> str:
    target = getattr(env, "target", None)
    return getattr(target, "name", None) or type(env).__name__
