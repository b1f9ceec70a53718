// tide dashboard: confirmations, auto-refresh and local times. The pages
// work without this script; it only makes them nicer.
(function () {
  'use strict';

  // Ask before destructive actions (forms with data-confirm), and disable
  // the button once a form is on its way so it is not sent twice.
  document.addEventListener('submit', function (e) {
    var form = e.target;
    var msg = form.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) {
      e.preventDefault();
      return;
    }
    var btn = form.querySelector('button[type=submit]');
    if (btn) {
      window.setTimeout(function () { btn.disabled = true; }, 0);
    }
  });

  // Optional auto-refresh every 5 seconds, remembered per browser.
  var box = document.getElementById('autorefresh');
  if (box) {
    var key = 'tide.dashboard.autorefresh';
    var timer = 0;
    var arm = function () {
      window.clearTimeout(timer);
      if (!box.checked) {
        return;
      }
      timer = window.setTimeout(function () {
        if (document.hidden) {
          arm();
        } else {
          window.location.reload();
        }
      }, 5000);
    };
    try {
      box.checked = window.localStorage.getItem(key) === '1';
    } catch (err) { /* storage disabled */ }
    box.addEventListener('change', function () {
      try {
        window.localStorage.setItem(key, box.checked ? '1' : '0');
      } catch (err) { /* storage disabled */ }
      arm();
    });
    arm();
  }

  // Show the local time of every timestamp on hover.
  var times = document.querySelectorAll('time[datetime]');
  for (var i = 0; i < times.length; i++) {
    var d = new Date(times[i].getAttribute('datetime'));
    if (!isNaN(d.getTime())) {
      times[i].title = d.toLocaleString() + ' (local) · ' + times[i].title;
    }
  }
})();
