"""The names and paths the hub and gpuspawner's services must agree on.

The hub's form script asks the user service for live figures, the hub's
configuration registers the services under these names, and each service
serves its routes under them: one place says what they are.
"""

from __future__ import annotations

#: The user-facing service's name in the hub configuration (URL prefix /services/<name>/).
USER_SERVICE_NAME = "gpuspawner"
#: Where the user service serves the spawn form's live figures, under its prefix.
AVAILABILITY_PATH = "availability"
#: Where the user service serves a user's own stop notices, under its prefix.
STOP_NOTICES_PATH = "stop-notices"
#: Where the user service keeps a user's server on request ("Keep for 1 h"), under its prefix.
KEEP_PATH = "keep"
#: The culler's service name (URL prefix /services/gpuspawner-culler/), which the user
#: service forwards a keep to.
CULLER_SERVICE_NAME = "gpuspawner-culler"
#: The culler's keep API, under its base URL.
CULLER_KEEP_API = "api/keep"


def access_scope(service: str = USER_SERVICE_NAME) -> str:
    """The scope a user needs to reach a service."""
    return f"access:services!service={service}"
