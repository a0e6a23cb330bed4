"""Who a connection is: users and their grants, the hub's tokens, a provider's, and the one verifier."""
