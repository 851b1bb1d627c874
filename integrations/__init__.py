"""Integrations of eurekamem with agent frameworks whose code we do not own.

`eurekamem.integrations.eurekaclaw`: EurekaClaw's memory, post-run learning and skills served by the
daemon (`install()`, or `python -m eurekamem.integrations.eurekaclaw`, or $EUREKAMEM_EUREKACLAW=1
with the sitecustomize line of the README). Importing this package imports nothing else.
"""
