"""Math evaluation of a served checkpoint, and the answer grader."""
