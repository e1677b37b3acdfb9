"""Exact-resume checkpoints: atomic writes, ``torch.load(weights_only=True)`` reads, a SHA-256
digest of the contents, and the RNG states (torch, Python, NumPy, CUDA, the data generator) that
make a resumed run continue bit for bit.

Checkpoints written before 0.3 (training method under ``"mode"``, attention families under
``...posterior.*``) load as the new spelling (:func:`upgrade_state`)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor

from .._deprecation import renamed_state_keys
from .._validation import atomic_write_bytes
from .config import upgrade_config_dict

if TYPE_CHECKING:
    from torch import nn

    from .config import TrainConfig

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "prepare_checkpoint_path",
    "upgrade_state",
    "check_state_fits",
    "checkpoint_header",
    "rng_state",
    "set_rng_state",
]

_FORMAT = "bayesattn.checkpoint"
_VERSION = 2  # 2: torch.optim.lr_scheduler schedules, data sources (loaders, streams)


def checkpoint_header() -> dict[str, Any]:
    """The entries that mark a state dict as a checkpoint of this format version."""
    return {"format": _FORMAT, "version": _VERSION}


class HasState(Protocol):
    """Anything whose state is a checkpoint: a :class:`~bayesattn.training.trainer.Trainer`."""

    def state_dict(self) -> dict[str, Any]: ...


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: corrupt, truncated, or not matching the trainer."""


def _digest(obj: Any) -> str:
    """SHA-256 over a canonical walk of a checkpoint's contents (tensors by dtype/shape/bytes)."""
    h = hashlib.sha256()

    def walk(o: Any) -> None:
        if isinstance(o, Tensor):
            t = o.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(o, dict):
            h.update(f"D{len(o)}".encode())
            for k in sorted(o, key=lambda k: (type(k).__name__, repr(k))):
                h.update(repr(k).encode())
                walk(o[k])
        elif isinstance(o, (list, tuple)):
            h.update(f"L{len(o)}".encode())
            for v in o:
                walk(v)
        else:
            h.update(f"{type(o).__name__}:{o!r};".encode())

    walk(obj)
    return h.hexdigest()


def prepare_checkpoint_path(path: str | os.PathLike) -> Path:
    """Check a checkpoint path before training: a file path whose folder exists or can be
    created and is writable. Removes temporary files (``.<name>.*.tmp``) left next to it by
    checkpoint writes that were killed. Raises ``ValueError``/``TypeError`` naming the path."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint_path must be a str or a path; got {type(path).__name__}")
    path = Path(path)
    if str(path) in ("", "."):
        raise ValueError(f"checkpoint_path must name a file; got {str(path)!r}")
    if path.is_dir():
        raise ValueError(
            f"checkpoint_path {str(path)!r} is a folder; give a file path such as "
            f"{str(path / 'checkpoint.pt')!r}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    for p in (parent, *parent.parents):
        if p.exists():
            if not p.is_dir():
                raise ValueError(
                    f"checkpoint_path {str(path)!r} lies under {str(p)!r}, which is a file"
                )
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the folder of checkpoint_path {str(path)!r}: {e}") from e
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"the folder of checkpoint_path {str(path)!r} is not writable")
    for stale in parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()
    return path


def save_checkpoint(path: str | os.PathLike, state: HasState | dict[str, Any]) -> Path:
    """Write a trainer's state (or a state dict from
    :meth:`~bayesattn.training.trainer.Trainer.state_dict`) atomically.

    The file is written to a temporary file in the same directory, flushed and fsynced, then
    moved over ``path`` with ``os.replace``: a crash leaves either the old or the new checkpoint,
    never a torn one. It loads with ``torch.load(path, weights_only=True)``.
    """
    if not isinstance(state, dict) and callable(getattr(state, "state_dict", None)):
        state = state.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"state must be a Trainer or a dict; got {type(state).__name__}")
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    payload = {k: v for k, v in state.items() if k != "sha256"}
    payload["sha256"] = _digest(payload)
    buf = io.BytesIO()
    torch.save(payload, buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


_REQUIRED = (
    "format",
    "version",
    "method",
    "config",
    "network",
    "optimizer",
    "step",
    "epoch",
    "rng",
)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load and verify a checkpoint written by :func:`save_checkpoint`.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: the file is not a readable ``torch.save`` archive (garbage, truncated),
            is not a bayesattn checkpoint, lacks required entries, or its contents do not match
            their SHA-256 digest (bit rot, partial overwrite).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling or zip failure: the file is unusable
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or truncated and could not be read "
            f"({type(e).__name__}: {e})"
        ) from e
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a bayesattn training checkpoint")
    old = {"method": "mode"}  # entries a checkpoint from before 0.3 holds under their old name
    missing = [k for k in _REQUIRED if k not in state and old.get(k) not in state]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks required entries {missing}")
    if state["version"] != _VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {state['version']!r}; "
            f"this bayesattn reads version {_VERSION}"
        )
    expected = state.pop("sha256", None)
    if expected != _digest(state):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt: its contents do not match their SHA-256 digest"
        )
    return upgrade_state(state)


def upgrade_state(
    state: dict[str, Any], network_keys: Any = None, param_names: Any = None
) -> dict[str, Any]:
    """A trainer state saved before 0.3 in the current spelling (a new dict; others unchanged).

    ``"mode"`` (entry and config field) becomes ``"method"``. With ``network_keys`` (the
    network's ``state_dict`` keys), keys of the network and best-weights states saved under an
    attention family's old submodule name ``posterior`` are mapped to ``family`` where that
    is the network's key; with ``param_names`` (SVI), so are the Pyro optimiser's entries.
    """
    state = dict(state)
    if "mode" in state and "method" not in state:
        state["method"] = state.pop("mode")
    if isinstance(state.get("config"), dict):
        state["config"] = upgrade_config_dict(state["config"])
    if network_keys is not None:
        known = set(network_keys)

        def fix(sd: Any) -> Any:
            if not isinstance(sd, dict):
                return sd
            ren = renamed_state_keys(sd, "posterior", "family", known)
            return {ren.get(k, k): v for k, v in sd.items()} if ren else sd

        state["network"] = fix(state.get("network"))
        es = state.get("early_stopping")
        if isinstance(es, dict) and isinstance(es.get("best_state"), dict):
            state["early_stopping"] = {**es, "best_state": fix(es["best_state"])}
    if param_names is not None and state.get("method") == "svi":
        opt = state.get("optimizer")
        if isinstance(opt, dict):
            ren = renamed_state_keys(opt, "posterior", "family", set(param_names))
            state["optimizer"] = {ren.get(k, k): v for k, v in opt.items()}
    return state


def check_state_fits(
    state: dict[str, Any],
    *,
    where: str,
    config: TrainConfig,
    data: dict[str, Any] | None,
    num_data: int | None,
    network: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    param_names: Any,
) -> None:
    """Raise :class:`CheckpointError` unless a (current-spelling) trainer ``state`` can be
    restored into a run with this ``config``, data source (``data``: its ``describe()``,
    ``None`` before any), ``num_data``, ``network`` and optimiser (``optimizer`` for the hybrid
    method; ``param_names``, the Pyro parameter names, for SVI). Nothing is modified."""
    _check_run_fits(state, where, config, data, num_data)
    _check_network_fits(state["network"], where, network)
    if config.method == "hybrid":
        if optimizer is None:
            raise ValueError("optimizer is required to check a checkpoint of the hybrid method")
        n_own = sum(len(g["params"]) for g in optimizer.param_groups)
        n_ckpt = sum(len(g["params"]) for g in state["optimizer"].get("param_groups", []))
        if n_own != n_ckpt:
            raise CheckpointError(
                f"checkpoint {where} optimiser holds {n_ckpt} parameters; the network has {n_own}"
            )
    else:
        unknown = sorted(set(state["optimizer"]) - set(param_names))
        if unknown:
            raise CheckpointError(
                f"checkpoint {where} has optimiser state for unknown parameters {unknown}"
            )


def _check_run_fits(
    state: dict[str, Any],
    where: str,
    config: TrainConfig,
    data: dict[str, Any] | None,
    num_data: int | None,
) -> None:
    """The method, the data source and the settings that define the saved position in the data."""
    if state["method"] != config.method:
        raise CheckpointError(
            f"checkpoint {where} was made with method {state['method']!r}; the trainer uses "
            f"method {config.method!r}"
        )
    saved = state.get("data") or {}
    # checkpoints before 0.6 name the source's type "kind" (read silently)
    saved_type = saved.get("source_type", saved.get("kind", "tensors"))
    if data is not None and saved_type != data["source_type"]:
        raise CheckpointError(
            f"checkpoint {where} was made on train_data of type {saved_type!r}; "
            f"got {data['source_type']!r}"
        )
    if data is not None and data["source_type"] == "stream":
        if saved.get("batch_size") != data["batch_size"]:  # position counted in batches
            raise CheckpointError(
                f"checkpoint {where} was made on a stream with batch_size="
                f"{saved.get('batch_size')!r}; got {data['batch_size']!r}"
            )
    keys = ("batch_size", "drop_last") if saved_type in ("tensors", "dataset") else ()
    for key in keys:  # they define the saved position in the data
        if state["config"].get(key) != getattr(config, key):
            raise CheckpointError(
                f"checkpoint {where} was made with {key}={state['config'].get(key)!r}; "
                f"the trainer has {key}={getattr(config, key)!r}"
            )
    if state.get("num_data") != num_data:
        raise CheckpointError(
            f"checkpoint {where} was made with {state.get('num_data')} training examples; "
            f"got {num_data}"
        )


def _check_network_fits(sd: dict[str, Any], where: str, network: nn.Module) -> None:
    """The saved network state has the network's keys and shapes."""
    own = network.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {where} does not match {type(network).__name__}: "
            f"missing keys {missing}, unexpected keys {unexpected}"
        )
    bad = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs network {tuple(v.shape)}"
        for k, v in own.items()
        if tuple(sd[k].shape) != tuple(v.shape)
    ]
    if bad:
        raise CheckpointError(f"checkpoint {where} has mismatched shapes: {bad}")


def rng_state(gen: torch.Generator) -> dict[str, Any]:
    """The RNG states (torch, Python, NumPy, CUDA when initialised) and the data generator's."""
    version, internal, gauss = random.getstate()
    np_state: Any = np.random.get_state()  # the legacy tuple (kind, keys, pos, has_gauss, cached)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": {
            "kind": str(np_state[0]),
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "data": gen.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], gen: torch.Generator) -> None:
    """Restore what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state(
        (
            npst["kind"],
            npst["keys"].numpy().astype(np.uint32),
            npst["pos"],
            npst["has_gauss"],
            npst["cached_gaussian"],
        )
    )
    gen.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
