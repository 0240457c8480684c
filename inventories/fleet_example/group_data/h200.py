"""H200 (SM90, NVLink): fa3 for both target and draft; SGLang's own memory default."""

specfleet = {
    "plan": {"draft_attention_backend": "fa3"},
}
