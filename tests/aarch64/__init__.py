"""specchat on aarch64, checked under qemu-aarch64 from an x86 machine (`make test-aarch64`)."""
