"""Token trees (decoding/tree.py): the engine's one-batch tree verify, the tree walk, and the loop's
output with tree rounds against plain decoding's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specchat.decoding.tree import TreeShape

from .tiny_models import write_tiny_llama

#: root, a three-token main chain, a sibling of its first token, a sibling of its second with a child
SHAPE = TreeShape((-1, 0, 1, 2, 0, 1, 5))
TOKENS = [0, 50, 51, 52, 60, 61, 62]


def test_shape_branches_and_paths():
    assert SHAPE.chain == 4
    assert SHAPE.n_branches == 3
    assert SHAPE.depth == (0, 1, 2, 3, 1, 2, 3)
    # a node's first branch runs through it, and its ancestors carry every branch it does
    for node, branches in enumerate(SHAPE.branches):
        parent = SHAPE.parents[node]
        if parent >= 0:
            assert set(branches) <= set(SHAPE.branches[parent])
    assert SHAPE.path_to(6) == [0, 1, 5, 6]
    assert TreeShape.of_chain(3).n_branches == 1
    with pytest.raises(ValueError):
        TreeShape((-1, 2, 0))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tree") / "t.gguf", seed=1)


def _one_token_rows(path: Path, context: list[int], steps: list[int]) -> np.ndarray:
    """The logits after each of `steps`, decoded one token at a time after `context`."""
    from specchat.llama.engine import LlamaModel, LoadOptions

    with LlamaModel(path, LoadOptions(n_ctx=256, gpu_layers=0)) as ref:
        ref.decode(context, [])
        return np.stack([ref.decode([t], [0])[0].copy() for t in steps])


def test_tree_rows_equal_one_token_decoding_and_keep_path_leaves_the_path(tiny_gguf: Path):
    from specchat.llama.engine import LlamaModel, LoadOptions

    context = list(range(10, 39))
    tokens = [39, *TOKENS[1:]]
    with LlamaModel(tiny_gguf, LoadOptions(n_ctx=256, gpu_layers=0, tree_branches=4)) as model:
        model.decode(context, [])
        rows = model.decode_tree(tokens, SHAPE, range(len(tokens))).copy()
        for node in range(len(tokens)):
            steps = [tokens[j] for j in SHAPE.path_to(node)]
            assert np.array_equal(rows[node], _one_token_rows(tiny_gguf, context, steps)[-1]), node
        # the path through the side branch: its nodes are left to decode in front of the next batch
        model.keep_path(SHAPE, [0, 1, 5, 6])
        assert list(model.tokens) == [*context, 39, 50, 61, 62]
        after = model.decode([70, 71], [0, 1]).copy()
        want = _one_token_rows(tiny_gguf, context, [39, 50, 61, 62, 70, 71])[-2:]
        assert np.array_equal(after, want)
        # and along the main chain, cut back as a chain round is
        model.truncate(len(context))
        model.decode_tree(tokens, SHAPE, [0])
        model.keep_path(SHAPE, [0, 1, 2])
        model.truncate(len(context) + 2)
        assert list(model.tokens) == [*context, 39, 50]
        nxt = model.decode([51], [0]).copy()
        assert np.array_equal(nxt[0], _one_token_rows(tiny_gguf, context, [39, 50, 51])[-1])


def test_a_tree_wider_than_the_context_allows_is_refused(tiny_gguf: Path):
    from specchat.errors import EngineError
    from specchat.llama.engine import LlamaModel, LoadOptions

    with LlamaModel(tiny_gguf, LoadOptions(n_ctx=256, gpu_layers=0, tree_branches=1)) as model:
        model.decode([1, 2, 3], [])
        with pytest.raises(EngineError):
            model.decode_tree(TOKENS, SHAPE, [0])
        assert list(model.tokens) == [1, 2, 3]
