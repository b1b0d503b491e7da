"""The notebook images' tooling: the version matrix, the build plan, `gpuspawner-images`.

smoke.py and healthcheck.py are copied into the images as standalone scripts;
they import nothing from gpuspawner.
"""
