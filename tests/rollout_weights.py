"""The weights-only deploy of the rollout tests' prefetch stage (like deploys/weights_only.py)."""

from operations import weights

weights.host_tools(name="Weights tools")
weights.host_token(name="Hugging Face token")
weights.model(name="Target weights", which="target")
weights.model(name="Drafter weights", which="drafter")
