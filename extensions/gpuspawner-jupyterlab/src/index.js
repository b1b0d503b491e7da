// The JupyterLab half of gpuspawner's cull warning: poll this server's
// /gpuspawner/warning (the server extension asks gpuspawner-culler with the
// server's own hub token) and show one notification per warning.
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

// Used until the server says how often to ask (poll_seconds in its answer).
const DEFAULT_POLL_SECONDS = 60;

/** The notification's text: when, why and how to keep the server. */
export function warningMessage(warning) {
  const at = new Date(warning.cull_at * 1000).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit'
  });
  return `This server will be stopped at ${at} because ${warning.why}. ${warning.keep}`;
}

const plugin = {
  id: 'gpuspawner-jupyterlab:cull-warning',
  description: 'Shows gpuspawner-culler\'s warning before it stops this server.',
  autoStart: true,
  activate: app => {
    const settings = app.serviceManager.serverSettings;
    const url = URLExt.join(settings.baseUrl, 'gpuspawner', 'warning');
    // warning key -> notification id: one notification per warning, not per poll
    const shown = new Map();

    const show = answer => {
      const warning = answer.warning;
      const key = warning ? `${warning.server}@${warning.warned_at}` : null;
      for (const [old, id] of shown) {
        if (old !== key) {
          Notification.dismiss(id); // used again: that warning is over
          shown.delete(old);
        }
      }
      if (warning && !shown.has(key)) {
        shown.set(key, Notification.warning(warningMessage(warning), { autoClose: false }));
      }
    };

    const poll = async () => {
      let next = DEFAULT_POLL_SECONDS;
      try {
        let response;
        try {
          response = await ServerConnection.makeRequest(url, {}, settings);
        } catch (error) {
          return; // the server is restarting or the network blinked: ask again later
        }
        if (response.status === 404) {
          next = null; // the server part is not installed here: nothing to ask
        } else if (response.ok) {
          const answer = await response.json();
          next = answer.poll_seconds || next;
          show(answer);
        }
      } finally {
        if (next !== null) {
          setTimeout(poll, next * 1000);
        }
      }
    };
    // toasts appear only once the shell is up: a notification sent earlier
    // would wait silently in the notification centre
    void app.restored.then(poll);
  }
};

export default plugin;
