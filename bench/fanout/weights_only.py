"""The weights-only deploy without fan-out (every host from upstream), for bench/fanout."""

from operations import weights

weights.host_tools(name="Weights tools")
weights.host_token(name="Hugging Face token")
weights.model(name="Target weights", which="target")
weights.model(name="Drafter weights", which="drafter")
