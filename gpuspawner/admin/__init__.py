"""The admin's window onto the GPU pool: the GPU page (a hub service) and ``gpuspawner status``.

- :mod:`~gpuspawner.admin.report` (pure): hub users, pods, GPU figures, limits
  and utilisation in, the tables out (HTML, text and JSON share them).
- :mod:`~gpuspawner.admin.page` (pure): the page's HTML, from the autoescaped Jinja
  templates in ``templates/``.
- :mod:`~gpuspawner.admin.collect`: reads the hub, the cluster and Prometheus
  (with the clients of :mod:`gpuspawner.clients` and :mod:`gpuspawner.clients.kube`).
- :mod:`~gpuspawner.admin.service`: the hub-managed service (``python -m gpuspawner.admin``).
"""
