"""`spinkv bench`: prefill/decode speed at context depths, per ISA and KV preset."""
