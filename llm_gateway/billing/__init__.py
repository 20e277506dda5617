"""What requests cost and who spent it: usage records and their durable writer."""
