"""The hub's live GPU inventory.

- :mod:`~gpuspawner.inventory.model` (pure): Node and Pod objects in, free GPUs
  per type and per node out.
- :mod:`~gpuspawner.inventory.figures` (pure): the catalog's types against the
  inventory, and the JSON the spawn form polls.
- :mod:`~gpuspawner.inventory.reflectors`: the one watch of nodes and one of
  pods per hub process that keep the model current.
- :mod:`~gpuspawner.hub.formscript`: the form's script, which keeps its figures current
  from the gpuspawner service (:mod:`gpuspawner.userservice`).
"""
