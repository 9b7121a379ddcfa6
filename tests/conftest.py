"""Root test configuration: the real etcd server fixture for every test dir."""

from controlplane.runtime.metrics import register_all

pytest_plugins = ["tests.etcd_server"]

# In-process tests host every component in one process: export every
# metric family (a real process registers only its own kind's).
register_all()
