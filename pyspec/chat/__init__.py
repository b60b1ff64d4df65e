"""Chats: from messages to the prompt the model's own template writes, and (with
structured output) back from the model's text to messages.

* ``templates.py``: the renderer, as llama-server renders a GGUF's
  ``tokenizer.chat_template`` (its variables, the messages as llama-server
  passes them, BOS/EOS, the built-in ChatML fallback);
* ``sandbox.py``: the bounded Jinja sandbox every template renders in (time
  ``RENDER_SECONDS``, size ``MAX_SIZE``), and :class:`ChatTemplateError`;
* ``tools.py``: tool calls: the format each template's model writes them in,
  the grammar of each ``tool_choice``, and the parser that reads them back.
"""

from .sandbox import MAX_SIZE, RENDER_SECONDS, ChatTemplateError, OverLimit
from .templates import RESERVED, ChatTemplate, Message, read_override

__all__ = ["MAX_SIZE", "RENDER_SECONDS", "RESERVED", "ChatTemplate", "ChatTemplateError", "Message", "OverLimit",
           "read_override"]
