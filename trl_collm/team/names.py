"""Agent names, checked once for every way they enter (`agent_names`, the keys of a `model={...}` dict, a saved
team's team.json): each becomes a folder name, a key of an `nn.ModuleDict` and a metric prefix."""

from __future__ import annotations

# Folder names a team already uses for itself.
RESERVED = ("critic", "critics")
# Bytes a name may take: a folder name is at most 255 bytes on common filesystems, and suffixes are added to it.
MAX_BYTES = 200


def name_problem(name) -> str | None:
    """Why `name` cannot name an agent, or None when it can."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    if "/" in name or "\\" in name or name.startswith("~"):
        return "holds a path separator (it would write outside the team folder)"
    if "." in name:
        return "holds a '.' (torch's ModuleDict refuses it, and '.', '..' or '.x' are not plain folders)"
    if name in RESERVED:
        return f"is reserved for the team's own {name!r} folder"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        return f"is longer than {MAX_BYTES} bytes (a folder name must fit the filesystem's limit)"
    if not name.isprintable():
        return "holds a control character"
    return None


def check_agent_names(names, source: str = "`agent_names`") -> list[str]:
    """Refuse a list of names with a bad or repeated entry, naming `source`, the name and the fix; returns it."""
    names = list(names)
    for name in names:
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(
                f"{source}: the agent name {name!r} {problem}; set `agent_names` (or the `model` dict's keys) to "
                "short names of letters, digits, '_' or '-', e.g. ['agent_0', 'agent_1']."
            )
    if len(set(names)) != len(names):
        raise ValueError(f"{source} must be unique, got {names}; give every agent its own name in `agent_names`.")
    return names
