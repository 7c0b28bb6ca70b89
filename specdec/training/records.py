"""Teacher records: per-position distillation data over P positions, flat (``TeacherData``),
saved to and read from safetensors shards with the decoder layers they hold in their metadata.
What each field holds: ``specdec.training.teacher``'s module docstring."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.errors import CorruptFileError
from specdec.models.files import parse_json

__all__ = ["TeacherData", "layers_entry"]


def layers_entry(handle, path) -> tuple:
    """The ``layers`` entry of an open teacher-data file's metadata (the decoder layers whose
    outputs it holds); CorruptFileError naming the file when it is not a JSON list of ints."""
    layers = parse_json(
        (handle.metadata() or {}).get("layers", "[]"),
        what=f"the layers entry of teacher data {path}",
        fix="delete the file so that it is recorded again",
    )
    if not isinstance(layers, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in layers
    ):
        raise CorruptFileError(
            f"the layers entry of teacher data {path} is not a list of layer ids; delete the file "
            "so that it is recorded again"
        )
    return tuple(layers)


@attrs.frozen(kw_only=True)
class TeacherData:
    """Flat per-position teacher data over P positions (see the module docstring for the fields).
    ``layers`` (P, n, H) holds the outputs of decoder layers ``layer_ids`` (None: not kept)."""

    hidden: torch.Tensor  # (P, H) bfloat16
    next_tokens: torch.Tensor  # (P,) int64
    label_ids: torch.Tensor  # (P, k) int64
    label_probs: torch.Tensor  # (P, k) float16
    remaining: torch.Tensor  # (P,) int64
    sequence: torch.Tensor  # (P,) int64, index of the sequence each position belongs to
    layers: torch.Tensor | None = None  # (P, n, H) bfloat16, decoder layers ``layer_ids``
    layer_ids: tuple = attrs.field(default=(), converter=tuple)

    @property
    def num_positions(self) -> int:
        return int(self.next_tokens.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.sequence.max()) + 1 if self.num_positions else 0

    def starts(self) -> torch.Tensor:
        """(S,) int64: the flat index of the first position of each sequence."""
        first = torch.ones_like(self.sequence, dtype=torch.bool)
        first[1:] = self.sequence[1:] != self.sequence[:-1]
        return torch.nonzero(first).flatten()

    def layer_outputs(
        self, ids: Sequence[int], positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(..., len(ids), H): the kept outputs of decoder layers ``ids`` (in that order, repeats
        allowed) at flat ``positions`` (...) (None: all P); a ValueError naming what is missing
        when the data do not hold them."""
        held = set(self.layer_ids) if self.layers is not None else set()
        missing = sorted(set(int(i) for i in ids) - held)
        if missing:
            raise ValueError(
                f"these teacher data hold decoder layers {sorted(held)}, not "
                f"{missing}: make them with TeacherSettings(layers=...) "
                "(train_drafter's teacher_layers)"
            )
        where = [self.layer_ids.index(int(i)) for i in ids]
        layers = self.layers if positions is None else self.layers[positions]
        return layers if where == list(range(len(self.layer_ids))) else layers[..., where, :]

    @classmethod
    def concat(cls, parts: Sequence["TeacherData"]) -> "TeacherData":
        """Join datasets; sequence indices are renumbered to stay distinct. The layers are kept
        only when every part holds the same ones."""
        offset, sequences = 0, []
        for part in parts:
            sequences.append(part.sequence + offset)
            offset += part.num_sequences
        join = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
        ids = {p.layer_ids if p.layers is not None else None for p in parts}
        same = len(ids) == 1 and None not in ids
        return cls(
            hidden=join("hidden"),
            next_tokens=join("next_tokens"),
            label_ids=join("label_ids"),
            label_probs=join("label_probs"),
            remaining=join("remaining"),
            sequence=torch.cat(sequences),
            layers=join("layers") if same else None,
            layer_ids=parts[0].layer_ids if same else (),
        )

    def save(self, path: Path, metadata: dict | None = None) -> None:
        """Write a safetensors file atomically (compact integer types on disk)."""
        tensors = {
            "hidden": self.hidden.contiguous(),
            "next_tokens": self.next_tokens.to(torch.int32),
            "label_ids": self.label_ids.to(torch.int32),
            "label_probs": self.label_probs.contiguous(),
            "remaining": self.remaining.to(torch.int32),
            "sequence": self.sequence.to(torch.int32),
        }
        header = {"specdec": json.dumps(metadata or {})}
        if self.layers is not None:
            tensors["layers"] = self.layers.contiguous()
            header["layers"] = json.dumps(list(self.layer_ids))
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        save_file(tensors, str(partial), metadata=header)
        partial.replace(path)

    @classmethod
    def load_many(cls, paths: Sequence[Path], *, layers: Sequence[int] = ()) -> "TeacherData":
        """The data of several files, joined as ``concat`` joins them, filled into tensors
        allocated once (no second copy of gigabytes of records while joining)."""
        layers = tuple(int(i) for i in layers)
        if len(paths) == 1:
            return cls.load(paths[0], layers=layers)
        shapes, stored = [], []
        for path in paths:
            with safe_open(str(path), framework="pt") as handle:
                shapes.append({name: handle.get_slice(name).get_shape() for name in handle.keys()})
                stored.append(layers_entry(handle, path))
            if not set(layers) <= set(stored[-1]):
                raise ValueError(
                    f"{path} holds decoder layers {list(stored[-1])}, not all of {list(layers)}"
                )
        total = sum(shape["next_tokens"][0] for shape in shapes)
        first = cls.load(paths[0])
        width, top = first.hidden.shape[1], first.label_ids.shape[1]
        out = {
            "hidden": torch.empty((total, width), dtype=first.hidden.dtype),
            "next_tokens": torch.empty(total, dtype=torch.long),
            "label_ids": torch.empty((total, top), dtype=torch.long),
            "label_probs": torch.empty((total, top), dtype=first.label_probs.dtype),
            "remaining": torch.empty(total, dtype=torch.long),
            "sequence": torch.empty(total, dtype=torch.long),
        }
        if layers:
            out["layers"] = torch.empty((total, len(layers), width), dtype=first.hidden.dtype)
        start, offset = 0, 0
        for path in paths:
            part = cls.load(path, layers=layers)
            end = start + part.num_positions
            for name in out:
                value = getattr(part, name)
                out[name][start:end] = value + offset if name == "sequence" else value
            start, offset = end, offset + part.num_sequences
            del part
        return cls(**out, layer_ids=layers if layers else ())

    @staticmethod
    def stored_layers(path: Path) -> tuple:
        """The decoder layers whose outputs the file at ``path`` holds (() for none)."""
        with safe_open(str(path), framework="pt") as handle:
            return layers_entry(handle, path)

    @classmethod
    def load(cls, path: Path, *, layers: Sequence[int] = ()) -> "TeacherData":
        """The data in ``path``, with the outputs of decoder ``layers`` (ascending) when asked for
        (a ValueError when the file lacks one; ``stored_layers`` says which it holds)."""
        layers = tuple(int(i) for i in layers)
        with safe_open(str(path), framework="pt") as handle:
            t = {name: handle.get_tensor(name) for name in handle.keys() if name != "layers"}
            stored = layers_entry(handle, path)
            if layers:
                if not set(layers) <= set(stored):
                    raise ValueError(
                        f"{path} holds decoder layers {list(stored)}, not all of {list(layers)}"
                    )
                t["layers"] = handle.get_tensor("layers")[:, [stored.index(i) for i in layers]]
        return cls(
            hidden=t["hidden"],
            next_tokens=t["next_tokens"].long(),
            label_ids=t["label_ids"].long(),
            label_probs=t["label_probs"],
            remaining=t["remaining"].long(),
            sequence=t["sequence"].long(),
            layers=t.get("layers"),
            layer_ids=layers,
        )
