# Two 8x H100 80 GB hosts serving Kimi K2.6 as one server: TP 16 over NCCL between them. Alone,
# one cannot: 70.1 GiB of weights per GPU at TP 8 is more than the ~56 GiB SGLang leaves for
# weights and KV cache on an H100 80 GB (docs/plan-and-memory.md, "Memory"); as a pair, 35.1 GiB
# per GPU.
# Rank 0 (the first member) holds the rendezvous and serves the API.
specfleet = {
    "group": {
        "name": "kimi-h100-pair",
        "members": ["h100-01", "h100-02"],
        # The port rank 0's rendezvous listens on; SGLang takes the next ports above it too.
        "rendezvous_port": 20000,
        # Unset: the interface that holds each member's ssh_hostname. Name it when the fast
        # network is another one than SSH's (e.g. "ib0" or "enp1s0f0").
        # "interface": "enp1s0f0",
    },
}
