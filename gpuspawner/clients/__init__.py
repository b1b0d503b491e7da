"""What gpuspawner's hub services share: clients and settings.

The culler (:mod:`gpuspawner.culler`) and the admin service
(:mod:`gpuspawner.admin`, and ``gpuspawner status``) talk to the same
things, configured the same way:

- :mod:`~gpuspawner.clients.hubapi`: the hub's REST API (retries, pagination);
- :mod:`~gpuspawner.clients.prometheus`: GPU activity per pod from the DCGM
  exporter's metrics (:class:`~gpuspawner.clients.prometheus.GPUQueries`);
- :mod:`~gpuspawner.clients.settings`: the traits for the hub API,
  Kubernetes (on/off, namespace) and Prometheus (URL, metric and label names);
- Kubernetes itself is read through :mod:`gpuspawner.clients.kube`, as the spawner does.
"""
