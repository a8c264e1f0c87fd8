"""`sparktop setup`: from hosts given to a working inventory, checking and fixing what a cluster needs.

`runner.Setup` checks each host (ssh and its host key, the ConnectX-7 ports, their addresses, MTU and RoCE
devices, the link between the nodes, the clocks, the Hugging Face cache's disk, Docker and the NVIDIA
runtime) and yields typed events (`events`); what it would change on a host it proposes first and does only
when told to. `parse` reads the tools' outputs, `inventory` writes the inventory with its comments,
`discover` lists the Sparks mDNS finds (`--discover`), `commands` (imported by the CLI only) renders the
events and asks.
"""
