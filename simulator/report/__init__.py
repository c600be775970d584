"""Self-contained HTML reports: the plan (``html.py``), the search (``search_html.py``), the
validation (``validate_html.py``) and sweeps (``sweep_html.py``), sharing ``page.py``."""
