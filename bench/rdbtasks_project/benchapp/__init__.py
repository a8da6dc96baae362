"""The benchmark's tasks, in an installed app as a real project would have them."""
