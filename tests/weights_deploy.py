"""The pyinfra deploy the weights tests run: tools, token, then the target's weights."""

from operations import weights

weights.host_tools(name="Weights tools")
weights.host_token(name="Hugging Face token")
weights.model(name="Target weights", which="target")
