"""What gpuspawner's hub services share: clients and settings.

The culler (:mod:`gpuspawner.culler`) and the admin service
(:mod:`gpuspawner.admin`, and ``gpuspawner status``) talk to the same
things, configured the same way:

- :mod:`~gpuspawner.services.hub`: the hub's REST API (retries, pagination);
- :mod:`~gpuspawner.services.prometheus`: GPU activity per pod from the DCGM
  exporter's metrics (:class:`~gpuspawner.services.prometheus.GPUQueries`);
- :mod:`~gpuspawner.services.settings`: the traits for the hub API,
  Kubernetes (on/off, namespace) and Prometheus (URL, metric and label names);
- Kubernetes itself is read through :mod:`gpuspawner.kube`, as the spawner does.
"""
