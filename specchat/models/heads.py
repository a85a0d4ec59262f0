"""Which drafter that reads the target's hidden states a target comes with, and whether a head file fits
it: found and checked from the files' headers, without loading them.

Three kinds exist. NextN layers inside the target's own GGUF (Qwen3.5 and later, Qwen3-Next, GLM,
MiMo: the registry's `mtp = true`, or the file header's `{arch}.nextn_predict_layers`); a separate
assistant file that reads the target's cache (Gemma 4's `mtp-gemma-4-*.gguf`, architecture
gemma4-assistant: the registry's `assistant`, a file given as `--draft mtp:assistant=PATH`, or one
named `mtp-*.gguf` in the target's folder); and an EAGLE-3 head trained for the target (architecture
eagle3: the registry's `eagle3`, `--draft eagle3:head=PATH`, or an `eagle3-*.gguf` in the target's
folder, as llama.cpp names them beside a model on the Hub). `--draft mtp` means whichever of the first
two the target has, `--draft eagle3` the third; the loader builds them (llama/mtp.py, llama/eagle3.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..decoding import registry as drafters
from ..errors import BadInput, IncompatiblePair, ModelFileError
from ..llama.dflash import DFLASH_ARCH, MARKOV_TENSOR, SELECTOR_TENSOR
from ..llama.eagle3 import EAGLE3_ARCH, LAYER_INPUT_ARCHS, N_TARGET_LAYERS
from .cache import cached_path
from .gguf import GGUFInfo, read_gguf
from .registry import ModelRef

#: the architecture llama.cpp gives Gemma 4's MTP assistant files, and the targets they draft for
ASSISTANT_ARCH = "gemma4-assistant"
ASSISTED_ARCHS = ("gemma4",)
#: ggml's type of the `d2t` table that maps a head's reduced vocabulary to the target's token ids
GGML_TYPE_I64 = 27
#: the tensors a model's rows look up (the embedding table) and end in (the output layer)
EMBED_TENSOR = "token_embd.weight"
OUTPUT_TENSOR = "output.weight"
#: what to do about a head that does not fit its target
_CONVERT_HINT = "use the head converted for this model (convert_hf_to_gguf.py --target-model-dir)"


def carries_nextn(ref: ModelRef) -> bool:
    """Whether the target's file keeps NextN layers: the registry entry says so, or the local (or
    already downloaded) file's header does. Never downloads anything."""
    if ref.entry is not None and ref.entry.mtp:
        return True
    path = cached_path(ref)
    if path is None:
        return False
    try:
        info = read_gguf(path)
    except ModelFileError:  # not a GGUF, or truncated: the loader says so in its own words
        return False
    return int(info.arch_get("nextn_predict_layers", 0) or 0) > 0


def sibling_head(target: Path, prefix: str, arch: str) -> Path | None:
    """A drafter file beside a local target: `{prefix}*.gguf` in its folder whose header says `arch`,
    the one whose name shares most with the target's if there are several."""
    found = []
    for path in sorted(target.parent.glob(f"{prefix}*.gguf")):
        try:
            if read_gguf(path).architecture == arch:
                found.append(path)
        except ModelFileError:
            continue
    stem = target.stem.lower()

    def shared(p: Path) -> int:
        name = p.stem.lower().removeprefix(prefix)
        return next(
            (i for i, (a, b) in enumerate(zip(name, stem, strict=False)) if a != b), min(len(name), len(stem))
        )

    return max(found, key=shared) if found else None


def _options(head_spec: str, allowed: str, example: str) -> dict[str, str]:
    """The options of `--draft NAME:key=PATH`, which take only `allowed`."""
    name, options = drafters.split(head_spec)
    unknown = set(options) - {allowed}
    if unknown:
        raise BadInput(
            f"--draft {head_spec}: `{name}` takes one option, {allowed}=PATH "
            f"(not {', '.join(sorted(unknown))})",
            f"write --draft {name} or --draft {name}:{allowed}={example}",
        )
    return options


def assistant_spec(target: ModelRef, head_spec: str) -> str | None:
    """What to load as the target's MTP assistant for `--draft mtp[:assistant=PATH]`: a path or the
    registry alias to fetch, or None where the target has none (then its NextN layers, if any)."""
    options = _options(head_spec, "assistant", "mtp-MODEL.gguf")
    if options.get("assistant"):
        return options["assistant"]
    if carries_nextn(target):
        return None
    if target.entry is not None and target.entry.assistant:
        return target.entry.assistant
    path = cached_path(target)
    if path is None or _architecture(path) not in ASSISTED_ARCHS:
        return None
    sibling = sibling_head(path, "mtp-", ASSISTANT_ARCH)
    return str(sibling) if sibling is not None else None


def eagle3_spec(target: ModelRef, head_spec: str) -> str | None:
    """What to load as the target's EAGLE-3 head for `--draft eagle3[:head=PATH]`: a path or the
    registry alias to fetch, or None where none is known (then `--draft eagle3` has nothing to run)."""
    options = _options(head_spec, "head", "eagle3-MODEL.gguf")
    if options.get("head"):
        return options["head"]
    if target.entry is not None and target.entry.eagle3:
        return target.entry.eagle3
    path = cached_path(target)
    if path is None:
        return None
    sibling = sibling_head(path, "eagle3-", EAGLE3_ARCH)
    return str(sibling) if sibling is not None else None


def block_spec(target: ModelRef, head_spec: str) -> str | None:
    """What to load as the target's block drafter for `--draft dflash[:model=PATH]` (or `dspark`): a
    path, or a `dflash-*.gguf` (`dspark-*.gguf`) beside a local target, or None where none is known."""
    name, _ = drafters.split(head_spec)
    options = _options(head_spec, "model", f"{name}-MODEL.gguf")
    if options.get("model"):
        return options["model"]
    path = cached_path(target)
    if path is None:
        return None
    sibling = sibling_head(path, f"{name}-", DFLASH_ARCH)
    return str(sibling) if sibling is not None else None


def head_file_spec(target: ModelRef, head_spec: str) -> str | None:
    """The drafter file `--draft head_spec` loads beside the target (an MTP assistant, an EAGLE-3
    head, a DFlash drafter), or None where it runs on the target's own file (NextN layers). BadInput
    where an EAGLE-3 head or a DFlash drafter is asked for and none is known."""
    name, _ = drafters.split(head_spec)
    if name in drafters.BLOCK_DRAFTERS:
        found = block_spec(target, head_spec)
        if found is None:
            what = "DSpark" if name == drafters.DSPARK else "DFlash"
            raise BadInput(
                f"no {what} drafter is known for {target.display}: give its file as "
                f"--draft {name}:model=PATH",
                f"a {name}-*.gguf beside the model is found too",
            )
        return found
    if name != drafters.EAGLE3:
        return assistant_spec(target, head_spec)
    spec = eagle3_spec(target, head_spec)
    if spec is None:
        raise BadInput(
            f"no EAGLE-3 head is known for {target.display}: give its file as --draft "
            f"{drafters.EAGLE3}:head=PATH",
            "the registry's `eagle3` key, or an eagle3-*.gguf beside the model, names one too",
        )
    return spec


def _architecture(path: Path) -> str | None:
    try:
        return read_gguf(path).architecture
    except ModelFileError:
        return None


def has_own_drafter(target: ModelRef) -> bool:
    """Whether `--draft mtp` has something to run for this target (its NextN layers or an assistant)."""
    return carries_nextn(target) or assistant_spec(target, drafters.MTP) is not None


def default_head(target: ModelRef) -> str | None:
    """The drafter that reads the target's hidden states which its default drafters include: its MTP
    drafter where it has one, else an EAGLE-3 head the registry names or that lies beside it."""
    if has_own_drafter(target):
        return drafters.MTP
    return drafters.EAGLE3 if eagle3_spec(target, drafters.EAGLE3) is not None else None


def check_eagle3_file(head: GGUFInfo, target: GGUFInfo) -> None:
    """One clear line, before anything is loaded, for an EAGLE-3 head llama.cpp could not run for this
    target (where llama.cpp would not refuse it but abort): not an EAGLE-3 head, one made for another
    target's depth, width or vocabulary, or a target whose graph hands out no layer inputs."""
    name = head.path.name
    layers = head.arch_get("target_layers")
    if head.architecture != EAGLE3_ARCH or not isinstance(layers, list) or len(layers) != N_TARGET_LAYERS:
        raise ModelFileError(
            f"{name} is no EAGLE-3 head (architecture {head.architecture or 'unknown'}, "
            f"target layers {layers})",
            "give the head's GGUF, converted with convert_hf_to_gguf.py --target-model-dir",
        )
    if head.n_layer != 1 or head.key_length != head.value_length:
        raise ModelFileError(
            f"{name} has {head.n_layer} decoder layers (keys of {head.key_length}, values of "
            f"{head.value_length}): llama.cpp runs EAGLE-3 heads of one, with keys and values alike",
            "convert the head again with a current convert_hf_to_gguf.py",
        )
    if target.architecture not in LAYER_INPUT_ARCHS:
        raise IncompatiblePair(
            f"llama.cpp hands out no layer inputs of {target.architecture} models, which the EAGLE-3 "
            f"head {name} reads",
            f"EAGLE-3 runs on {', '.join(sorted(LAYER_INPUT_ARCHS))} targets; draft with another --draft",
        )
    if not all(0 <= int(i) < target.n_layer for i in layers):
        raise IncompatiblePair(
            f"the EAGLE-3 head {name} reads target layers {layers}, but {target.path.name} has "
            f"{target.n_layer} (llama.cpp gives the inputs of layers 0 to {target.n_layer - 1})",
            _CONVERT_HINT,
        )
    hidden = int(head.arch_get("target_hidden_size", 0) or 0)
    if hidden != target.n_embd:
        raise IncompatiblePair(
            f"the EAGLE-3 head {name} is for a target of width {hidden}, not "
            f"{target.path.name}'s {target.n_embd}",
            _CONVERT_HINT,
        )
    _check_tables(head, target)


def _check_tables(head: GGUFInfo, target: GGUFInfo) -> None:
    """The head's vocabulary and the tables it may borrow from the target (token embedding, output
    projection: then its width must be the target's), and its `d2t` map into the target's ids."""
    name = head.path.name
    tensors = {t.name: t for t in head.tensors}
    borrows = [t for t in (EMBED_TENSOR, OUTPUT_TENSOR) if t not in tensors]
    if head.n_vocab != target.n_vocab or (borrows and head.n_embd != target.n_embd):
        raise IncompatiblePair(
            f"the EAGLE-3 head {name} ({head.n_vocab} tokens, width {head.n_embd}"
            f"{', borrowing ' + ' and '.join(borrows) if borrows else ''}) does not fit "
            f"{target.path.name} ({target.n_vocab} tokens, width {target.n_embd})",
            _CONVERT_HINT,
        )
    d2t = tensors.get("d2t")
    if d2t is None:
        return
    output = tensors.get(OUTPUT_TENSOR)
    rows = output.shape[1] if output is not None and len(output.shape) == 2 else target.n_vocab
    bad = d2t.ggml_type != GGML_TYPE_I64 or d2t.shape != (rows,)
    if not bad:
        with open(head.path, "rb") as f:
            f.seek(head.data_offset + d2t.offset)
            ids = np.frombuffer(f.read(8 * rows), dtype=np.dtype(np.int64).newbyteorder(head.byteorder))
        bad = len(ids) != rows or bool(((ids < 0) | (ids >= target.n_vocab)).any())
    if bad:
        raise ModelFileError(
            f"the vocabulary map (d2t) of the EAGLE-3 head {name} is not {rows} token ids of "
            f"{target.path.name}'s {target.n_vocab}",
            "convert the head again with a current convert_hf_to_gguf.py",
        )


def check_dflash_file(drafter: GGUFInfo, target: GGUFInfo, *, dspark: bool = False) -> None:
    """One clear line, before anything is loaded, for a DFlash drafter (`dspark`: a DSpark one)
    llama.cpp could not run for this target (where llama.cpp would not refuse it but abort or draft
    from the wrong rows): not a DFlash drafter, a DFlash2 file without its selector's size, a DSpark file
    given as DFlash or the other way round (their blocks are laid out differently), one made for
    another target's depth, width or vocabulary, or a target whose graph hands out no layer inputs."""
    name = drafter.path.name
    layers = drafter.arch_get("target_layers")
    if drafter.architecture != DFLASH_ARCH or not isinstance(layers, list) or not layers:
        raise ModelFileError(
            f"{name} is no DFlash drafter (architecture {drafter.architecture or 'unknown'}, "
            f"target layers {layers})",
            "give the drafter's GGUF, converted with convert_hf_to_gguf.py --target-model-dir",
        )
    tensors = {t.name for t in drafter.tensors}
    if SELECTOR_TENSOR in tensors and not (drafter.arch_get("selector_top_k") or 0) > 0:
        raise ModelFileError(
            f"{name} is a DFlash2 drafter ({SELECTOR_TENSOR}) without its selector's size "
            "(dflash.selector_top_k)",
            "convert the drafter again with a current convert_hf_to_gguf.py",
        )
    if (MARKOV_TENSOR in tensors) != dspark:
        has = "a DSpark drafter (a Markov head)" if not dspark else "a DFlash drafter without a Markov head"
        right = drafters.DFLASH if dspark else drafters.DSPARK
        raise ModelFileError(f"{name} is {has}", f"run it with --draft {right}:model={drafter.path}")
    if target.architecture not in LAYER_INPUT_ARCHS:
        raise IncompatiblePair(
            f"llama.cpp hands out no layer inputs of {target.architecture} models, which the DFlash "
            f"drafter {name} reads",
            f"DFlash runs on {', '.join(sorted(LAYER_INPUT_ARCHS))} targets; draft with another --draft",
        )
    if not all(0 <= int(i) < target.n_layer for i in layers):
        raise IncompatiblePair(
            f"the DFlash drafter {name} reads target layers {layers}, but {target.path.name} has "
            f"{target.n_layer} (llama.cpp gives the inputs of layers 0 to {target.n_layer - 1})",
            _CONVERT_HINT.replace("head", "drafter"),
        )
    if drafter.n_embd != target.n_embd or drafter.n_vocab != target.n_vocab:
        raise IncompatiblePair(
            f"the DFlash drafter {name} ({drafter.n_vocab} tokens, width {drafter.n_embd}) does not "
            f"fit {target.path.name} ({target.n_vocab} tokens, width {target.n_embd})",
            _CONVERT_HINT.replace("head", "drafter"),
        )


def _row_bytes(info: GGUFInfo, borrowed_output: int = 0) -> int:
    """Bytes of weights one token's row runs through: every tensor but the embedding table, which a
    row only looks up (unless it is also the output layer: tied, no output.weight). A drafter without
    an output layer of its own runs its target's (`borrowed_output`)."""
    names = {t.name for t in info.tensors}
    tied = OUTPUT_TENSOR not in names
    total = sum(t.nbytes or 0 for t in info.tensors if t.name != EMBED_TENSOR or tied)
    if tied and EMBED_TENSOR not in names:
        total += borrowed_output
    return total


def block_pass_share(drafter: GGUFInfo, target: GGUFInfo) -> float:
    """What a block drafter's pass of n rows costs over the target's verify batch of n rows, before
    either is timed: their weights per row, as both run the same kinds of matmul (the planner learns
    the true ratio from the first blocks). A DFlash drafter computes its own output layer for every
    row, so on a CPU a block of 16 costs far more than one target token even for a drafter of 1-2
    layers; the share is what lets the planner know that before its first block."""
    own = _row_bytes(target)
    tensors = {t.name: t for t in target.tensors}
    # the target's output layer, or the embedding a tied target projects with (not whichever of the
    # two comes first in the file: the embedding is often of another, smaller type)
    head = tensors.get(OUTPUT_TENSOR) or tensors.get(EMBED_TENSOR)
    output = (head.nbytes or 0) if head is not None else 0
    return _row_bytes(drafter, borrowed_output=output) / own if own > 0 else 0.0
