"""`specchat bench`: plain vs speculative decoding measured side by side; returns results, prints nothing.

Owns the whole benchmark (`run.run_bench`, the interleaved measurement, the exactness audit, the
prediction for flat-verify hardware, the result document) and the equivalent command lines for other
servers (`export`: llama-server, vLLM). Printing is the CLI's (`cli.bench`, `cli.bench_report`).

May import: the foundations and `specchat.decoding` (it measures any `decoding.model.Model`). Never
llama_cpp, `specchat.llama`, `specchat.models`, `specchat.server` or `specchat.cli`.
"""
