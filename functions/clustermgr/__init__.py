"""ClusterMgr control function: node registration, heartbeats, liveness."""
