"""Root test configuration: the real etcd server fixture for every test dir."""

pytest_plugins = ["tests.etcd_server"]
