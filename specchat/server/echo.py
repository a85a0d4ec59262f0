"""Log-probabilities of a prompt's own tokens, for /v1/completions with `echo` and `logprobs`: how
evaluation harnesses score a text (the log-likelihood of a continuation given its context).

A cached prefix keeps no logits, so the target re-reads the whole prompt, a logits row per token, in
chunks; the cache then holds what generation expects (the prompt but its last token), so the answer
that follows decodes nothing more. The cost is one prefill of the prompt, paid only by requests that
ask for this. The first token has no log-probability (nothing comes before it), as OpenAI reports;
the others are the model's own distribution (log_softmax), whatever the request's temperature, since
no sampling chose them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..decoding.logprobs import token_logprob
from ..decoding.loop import Detokenizer
from ..decoding.model import Model
from ..decoding.sampling import SamplingParams
from .responses import LogprobEntry, logprob_entry

#: Rows per decode: 64 x a 152k vocabulary is 39 MB of logits at a time.
CHUNK = 64
RAW = SamplingParams(temperature=0.0)


def prompt_logprobs(target: Model, prompt: Sequence[int], n_top: int) -> tuple[LogprobEntry, ...]:
    """Each prompt token's entry, its text offset counted in the prompt's detokenized text."""
    detok = Detokenizer(target)
    first = prompt[0]
    out = [LogprobEntry(target.token_bytes(first), None, (), 0)]
    offset = len(detok.piece(first))
    target.truncate(0)
    end = len(prompt) - 1
    for start in range(0, end, CHUNK):
        stop = min(start + CHUNK, end)
        rows = target.decode(prompt[start:stop], range(stop - start))
        for j in range(stop - start):
            token = prompt[start + j + 1]
            lp = token_logprob(rows[j], token, RAW, n_top)
            out.append(logprob_entry(token, lp, offset, target.token_bytes))
            offset += len(detok.piece(token))
    return tuple(out)
