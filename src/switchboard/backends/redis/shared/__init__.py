"""What the Redis bus and stores share: clients and their timeouts, patience, backoff and the
breaker, batched scripts, and a cluster's topology and setup."""
