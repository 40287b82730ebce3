"""Headless Chromium driven over its DevTools pipe, to ask a rendered page what `--dump-dom` cannot show: computed
styles, loaded fonts, the resources it fetched.

`--remote-debugging-pipe` makes Chromium read DevTools protocol commands from its file descriptor 3 and write
replies and events to 4, each a JSON object ended by a NUL byte; no port, no websocket library. Every wait is
bounded.
"""
import json
import os
import select
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Dict

FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync',
         '--disable-dev-shm-usage', '--window-size=1200,900']


class DevToolsError(AssertionError):
    pass


class DevToolsPage:
    """One tab of a Chromium started for it; `with DevToolsPage(chromium, profile) as page: page.open(url)`."""

    def __init__(self, chromium: str, profile_dir: Path, timeout: float = 60):
        self.timeout = timeout
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()
        # bash puts the two pipe ends on the descriptors 3 and 4 that Chromium expects (sh may refuse descriptors
        # above 9, which the pipes get inside pytest)
        line = ' '.join(shlex.quote(part) for part in [chromium, *FLAGS, f'--user-data-dir={profile_dir}',
                                                          '--remote-debugging-pipe', 'about:blank'])
        self._process = subprocess.Popen(['bash', '-c', f'exec {line} 3<&{commands_read} 4>&{replies_write}'],
                                         pass_fds=(commands_read, replies_write), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b''
        self._next_id = 0
        self._session = None

    def __enter__(self) -> 'DevToolsPage':
        target = self.send('Target.createTarget', {'url': 'about:blank'})['targetId']
        self._session = self.send('Target.attachToTarget', {'targetId': target, 'flatten': True})['sessionId']
        self.send('Page.enable')
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.send('Browser.close', session=False)
        except (DevToolsError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        os.close(self._commands)
        os.close(self._replies)

    def send(self, method: str, params: Dict[str, Any] = None, session: bool = True) -> Dict[str, Any]:
        """One command; its result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        message = {'id': self._next_id, 'method': method, 'params': params or {}}
        if session and self._session:
            message['sessionId'] = self._session
        os.write(self._commands, json.dumps(message).encode() + b'\0')
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get('id') == self._next_id:
                if 'error' in reply:
                    raise DevToolsError(f'{method}: {reply["error"]}')
                return reply['result']

    def _read(self, deadline: float) -> Dict[str, Any]:
        while b'\0' not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise DevToolsError(f'no reply from Chromium within {self.timeout} s')
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise DevToolsError(f'Chromium closed its pipe: {self._process.stderr.read()[-3000:]!r}')
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b'\0', 1)
        return json.loads(message)

    def open(self, url: str) -> None:
        assert url.startswith('http://127.0.0.1:'), url
        self.send('Page.navigate', {'url': url})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.send('Runtime.evaluate', {'expression': expression, 'returnByValue': True,
                                                'awaitPromise': True})
        if 'exceptionDetails' in result:
            raise DevToolsError(f'{expression}: {result["exceptionDetails"]}')
        return result['result'].get('value')

    def wait_for(self, expression: str, timeout: float = 30) -> None:
        """Until `expression` is true in the page."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise DevToolsError(f'not true after {timeout} s: {expression}')
            time.sleep(0.2)

    def screenshot(self, path: Path) -> None:
        import base64
        path.write_bytes(base64.b64decode(self.send('Page.captureScreenshot', {'format': 'png'})['data']))
