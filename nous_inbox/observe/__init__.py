"""Observing owners and hosts from the tools operators already run (``pip install
nous-inbox[metrics]``; the web extra has it too).

:class:`Metrics` counts what attached owners, their store and a web host do, in a Prometheus
registry of its own; see :mod:`nous_inbox.observe.metrics`.
"""

from nous_inbox.observe.metrics import CONTENT_TYPE, Metrics, Observed

__all__ = ["CONTENT_TYPE", "Metrics", "Observed"]
