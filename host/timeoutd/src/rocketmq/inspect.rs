//! What `timeoutd doctor` asks the broker, by admin reads only (RocketMQ's `mqadmin topicRoute`
//! and `consumerConnection`): whether each topic timeoutd uses has a route, and what the clients
//! connected to each of its consumer groups subscribe to. A consumer group must share one
//! subscription: RocketMQ balances a group's queues over its members, so a member subscribed to
//! something else loses (or steals) messages (the RocketMQ docs, "Subscription consistency").

use std::time::Duration;

use rocketmq_client_rust::{DefaultMQAdminExt, MQAdminReadExt};

use super::TransportError;
use crate::config::RocketMqConfig;

/// The broker's view of timeoutd's topics and groups.
#[derive(Debug, Clone, Default)]
pub struct Inspection {
    /// Each topic timeoutd uses, with its read queues (`None`: no route, the topic does not
    /// exist yet).
    pub topics: Vec<(String, Option<u32>)>,
    /// Each consumer group timeoutd uses, with the clients connected to it and what the group
    /// subscribes to (topic, expression), retry topics left out; or why it could not be read.
    pub groups: Vec<(String, Result<Group, String>)>,
}

/// One consumer group as the broker sees it.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Connected clients.
    pub clients: usize,
    /// (topic, subscription expression), sorted; `%RETRY%` topics left out.
    pub subscriptions: Vec<(String, String)>,
}

/// How long each admin read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The topics timeoutd uses under `config`: the timeout topic, the notification topic and,
/// when configured, the paid topic.
pub fn topics(config: &RocketMqConfig) -> Vec<String> {
    let mut topics = vec![config.topic.clone(), config.notification_topic.clone()];
    topics.extend(config.paid_topic.clone());
    topics
}

/// Its consumer groups with the topic each subscribes to (`*`): the timeout consumer and, with a
/// paid topic, the paid-notice consumer (`rocketmq.paid_group`, by default `<group>-PAID`).
pub fn groups(config: &RocketMqConfig) -> Vec<(String, String)> {
    let mut groups = Vec::new();
    if config.consume {
        groups.push((config.consumer_group.clone(), config.topic.clone()));
    }
    if let Some(paid) = &config.paid_topic {
        let group = config
            .paid_group
            .clone()
            .unwrap_or_else(|| super::paid::default_group(&config.consumer_group));
        groups.push((group, paid.clone()));
    }
    groups
}

/// Reads the broker's view through an admin client of its own (started and shut down here).
///
/// # Errors
/// [`TransportError::Start`] when the admin client cannot start (no name server).
pub async fn inspect(config: &RocketMqConfig) -> Result<Inspection, TransportError> {
    let (handle, client_runtime, stop, thread) = tokio::task::spawn_blocking(|| {
        super::client::spawn_client_runtime("timeoutd-doctor", super::client::CLIENT_THREADS, 1)
    })
    .await
    .map_err(|e| TransportError::Start(format!("client runtime thread: {e}")))??;
    let (namesrv, topics, groups) = (config.namesrv.clone(), topics(config), groups(config));
    let read = handle
        .spawn(async move {
            let mut admin = DefaultMQAdminExt::with_timeout(client_runtime, READ_TIMEOUT);
            admin.set_namesrv_addr(namesrv.as_str());
            admin
                .start()
                .await
                .map_err(|e| TransportError::Start(format!("admin client: {e}")))?;
            let mut inspection = Inspection::default();
            for topic in topics {
                let queues = match admin.examine_topic_route_info(topic.as_str().into()).await {
                    Ok(Some(route)) => {
                        Some(route.queue_datas.iter().map(|q| q.read_queue_nums).sum())
                    }
                    _ => None,
                };
                inspection.topics.push((topic, queues));
            }
            for (group, _) in groups {
                let seen = admin
                    .examine_consumer_connection_info(group.as_str().into(), None)
                    .await
                    .map(|c| {
                        let mut subscriptions: Vec<(String, String)> = c
                            .get_subscription_table()
                            .values()
                            .filter(|s| !s.topic.starts_with("%RETRY%"))
                            .map(|s| (s.topic.to_string(), s.sub_string.to_string()))
                            .collect();
                        subscriptions.sort();
                        Group {
                            clients: c.get_connection_set().len(),
                            subscriptions,
                        }
                    })
                    .map_err(|e| e.to_string());
                inspection.groups.push((group, seen));
            }
            admin.shutdown().await;
            Ok::<_, TransportError>(inspection)
        })
        .await
        .map_err(|e| TransportError::Start(format!("admin task: {e}")));
    let _ = stop.send(());
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    read?
}
