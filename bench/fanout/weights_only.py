"""The weights-only deploy without fan-out (every host from upstream), for bench/fanout."""

from operations import weights

weights.tools_from_settings(name="Weights tools")
weights.token_from_settings(name="Hugging Face token")
weights.model(name="Target weights", which="target")
weights.model(name="Drafter weights", which="drafter")
