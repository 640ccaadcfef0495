"""What a request is: who asks and what their tier allows (access), what is checked before work is queued (admission),
what it says once admitted (script), and the records of its work by layer."""
