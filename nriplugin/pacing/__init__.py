"""The event loop the hooks share with long work.

One loop answers the runtime's hooks and runs the reconciler's passes, the QoS manager's
rounds, the inventory and network QoS. What lets them share it without a hook waiting behind
a node-sized job lives here, in objects the agent creates and hands to those who need them:

- :class:`~nriplugin.pacing.selector.PollClock`, the loop's selector: when a request's bytes
  could first have been read, and awake through a burst of hooks;
- :class:`~nriplugin.pacing.traffic.HookTraffic`: the trunks' sockets and their last answer
  (the transport tells it, long work asks it);
- :class:`~nriplugin.pacing.turns.Pacer`: long work in turns, work right after the current
  callback, and work that waits out a burst of hooks.

Nothing here knows NRI or the node: the transport and the packages that do long work depend
on this, not on each other.
"""
