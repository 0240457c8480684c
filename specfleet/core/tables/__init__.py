"""The tables of what specfleet knows: SGLang releases, GPU architectures, models.

Adding an SGLang release or a GPU architecture is one row here plus one fixture.
"""
