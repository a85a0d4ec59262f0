"""The one package that talks to llama.cpp: no module outside `specchat/llama/` imports llama_cpp.

`lib` imports llama-cpp-python once for the package (a build whose libraries do not load is one line)
and `log` quiets llama.cpp's own log; `engine` runs llama.cpp's models behind the
`decoding.model.Model` protocol, with `rollback` (taking a recurrent cache back), `vocab` (the
tokenizer) and `template` (chat templates) beside it; `devices` says what the build runs on
(backends, GPU memory); `head`, `mtp` and `eagle3` are the heads that read the target's hidden
states (drafters through `decoding.drafters.HeadDrafter`); `grammar` turns grammars and JSON schemas
into a constraint; `buildcheck` and `invariance` check the installed build in a child process
(`child`, `probe_model`, `probe_hybrid`), `build` and `patchqueue` make it; `reference` runs
llama.cpp's own programs for comparison.

May import: llama_cpp, the foundations (`specchat.errors`, `specchat.store`, `specchat.terminal`) and
`specchat.decoding`. Never `specchat.models`, `specchat.server`, `specchat.cli` or `specchat.bench`.
"""
