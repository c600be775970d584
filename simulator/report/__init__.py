"""Reports of a plan: one self-contained HTML file (``html.py``)."""
