"""What replicas keep in Redis: the registry and the clients in transit, workspaces and their data,
counts, revoked tokens, sign-ins, task queues, the leader lease and replicas' presence."""
