"""The event bus on Redis: pub/sub on one instance or sharded on a cluster, its acknowledgements,
subscriptions and batched unsubscribes."""
