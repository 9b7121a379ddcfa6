"""The node's entry: the only way into an instance that runs in a network
namespace of its own. One entry per node agent (in its event loop), with a
listener per instance on the node's advertised address; each request must
carry a lease token Dispatch signed for that instance (``door``), and is then
forwarded into the instance's namespace (``netns``). docs/security.md
describes the boundary and where per-instance work at the door belongs."""
