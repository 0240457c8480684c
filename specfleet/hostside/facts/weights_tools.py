"""facts.weights.WeightsTools: the tools venv's huggingface_hub and the weights agent's sha256.
argv[1]: the tools folder."""
# needs: installed_dists, dist_version

import hashlib
import os
import sys

path = sys.argv[1]
out = {"path": path, "huggingface_hub": None, "agent_sha256": None}
agent = os.path.join(path, "weights_agent.py")
if os.path.isfile(agent):
    with open(agent, "rb") as f:
        out["agent_sha256"] = hashlib.sha256(f.read()).hexdigest()
out["huggingface_hub"] = dist_version(sys.path, "huggingface_hub")
print(repr(out))
