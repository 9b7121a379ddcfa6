"""Node agent: runs function instances (sandboxes) for one or many nodes,
reports their capacity, and keeps them registered with ClusterMgr."""
