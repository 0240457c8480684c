"""Programs shipped to hosts and run there: stdlib only, importing nothing of the project.

They travel as package data (``importlib.resources``) and are uploaded or sent inline.
"""
