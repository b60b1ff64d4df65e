"""Chats: from messages to the prompt the model's own template writes, and (with
structured output) back from the model's text to messages.

* ``templates.py``: the renderer, as llama-server renders a GGUF's
  ``tokenizer.chat_template`` (its variables, the messages as llama-server
  passes them, BOS/EOS, the built-in ChatML fallback);
* ``sandbox.py``: the bounded Jinja sandbox every template renders in (time
  ``RENDER_SECONDS``, size ``MAX_SIZE``), and :class:`ChatTemplateError`.

The parsing of tool calls out of generated text belongs here too, beside the
templates that write them.
"""

from .sandbox import MAX_SIZE, RENDER_SECONDS, ChatTemplateError, OverLimit
from .templates import RESERVED, ChatTemplate, Message, read_override

__all__ = ["MAX_SIZE", "RENDER_SECONDS", "RESERVED", "ChatTemplate", "ChatTemplateError", "Message", "OverLimit",
           "read_override"]
