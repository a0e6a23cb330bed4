"""What a replica does because it has peers, beside the traffic: presence, the leader lease, the
orphan reaper, recovery after the store lost its data, and the status an operator reads."""
