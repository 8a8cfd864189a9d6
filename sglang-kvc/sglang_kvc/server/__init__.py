"""The HTTP front: SGLang native routes, OpenAI routes, the app and its server thread."""
