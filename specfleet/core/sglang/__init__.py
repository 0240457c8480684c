"""Pure SGLang decisions: what to install, which compressed-tensors, PR#20547, the diff."""
