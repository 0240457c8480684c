"""The pyinfra deploy the weights tests run: tools, token, then the target's weights."""

from operations import weights

weights.tools_from_settings(name="Weights tools")
weights.token_from_settings(name="Hugging Face token")
weights.model(name="Target weights", which="target")
