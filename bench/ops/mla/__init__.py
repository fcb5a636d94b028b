"""The MLA decode operator (DeepSeek's latent KV cache): cases, their sweep and FlashMLA's cost count (cases.py), the
seeded and large-logit inputs (inputs.py), the float64 reference and the low-precision baseline, both the attention
operator's blocked math over the latent (reference.py), and the memory charge (memory.py); record.py registers them
as one record."""
