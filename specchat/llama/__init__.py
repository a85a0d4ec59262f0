"""The one place that talks to llama.cpp.

Owns `engine` (llama_cpp's models behind the `decoding.model.Model` protocol; the only module that
imports llama_cpp), `buildcheck` (the self-check of the installed llama.cpp build, run in a child
process) and `reference` (running llama.cpp's own programs for comparison).

May import: llama_cpp, the foundations (`specchat.errors`, `specchat.store`, `specchat.terminal`) and
`specchat.decoding`. Never `specchat.models`, `specchat.server`, `specchat.cli` or `specchat.bench`.
"""
