# ruff: noqa: RUF001, RUF005  (hand-written data: Chinese punctuation, list building)
"""Writes questions.jsonl and conversations.jsonl from the hand-written pairs below.

Run from the repository root: `python tests/data/build_pairs.py`. See README.md beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent

# (category, same_answer, [(a, b), ...]) -- every pair written by hand.
QUESTIONS: list[tuple[str, bool, list[tuple[str, str]]]] = [
    (
        "en_paraphrase",
        True,
        [
            ("How do I reset my password?", "How can I reset my password?"),
            ("What is the capital of Australia?", "What's the capital city of Australia?"),
            ("How do I cancel my subscription?", "How can I cancel my subscription?"),
            ("What are the opening hours of the store?", "What are the store's opening hours?"),
            ("How do I change my email address?", "How can I change my email address?"),
            ("Where can I download the mobile app?", "Where do I download the mobile app?"),
            ("How long does shipping take?", "How long does it take for shipping?"),
            (
                "Can I return an item after 30 days?",
                "Is it possible to return an item after 30 days?",
            ),
            ("How do I update my billing information?", "How can I update my billing information?"),
            (
                "What is the difference between a list and a tuple in Python?",
                "What's the difference between a tuple and a list in Python?",
            ),
            (
                "How do I sort a dictionary by value in Python?",
                "How can I sort a Python dictionary by value?",
            ),
            ("What does HTTP status 404 mean?", "What is the meaning of HTTP status 404?"),
            (
                "How do I enable two-factor authentication?",
                "How can I turn on two-factor authentication?",
            ),
            ("How do I delete my account?", "How can I delete my account?"),
            ("What payment methods do you accept?", "Which payment methods do you accept?"),
            ("How do I contact customer support?", "How can I contact customer support?"),
            ("Is there a free trial?", "Do you offer a free trial?"),
            ("How do I export my data?", "How can I export my data?"),
            ("What is photosynthesis?", "Can you explain what photosynthesis is?"),
            ("How many calories are in an apple?", "How many calories does an apple have?"),
            ("What is the boiling point of water?", "At what temperature does water boil?"),
            ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
            ("How do I make a cup of green tea?", "How should I make a cup of green tea?"),
            (
                "What is a good way to learn Spanish?",
                "What is a good way to learn the Spanish language?",
            ),
            (
                "How do I create a virtual environment in Python?",
                "How can I create a Python virtual environment?",
            ),
            ("How do I undo the last git commit?", "How can I undo my last git commit?"),
            ("What is the speed of light?", "How fast is the speed of light?"),
            ("How do I track my order?", "How can I track my order?"),
            ("Why is the sky blue?", "Why does the sky look blue?"),
            ("How do I add a printer on Windows?", "How can I add a printer in Windows?"),
            ("What is machine learning?", "What is machine learning, in simple terms?"),
            (
                "How do I unsubscribe from the newsletter?",
                "How can I unsubscribe from your newsletter?",
            ),
            ("Do you ship internationally?", "Do you offer international shipping?"),
            ("How do I change the language of the app?", "How can I change the app's language?"),
            ("What is the return policy?", "What's your return policy?"),
            ("How do I merge two branches in git?", "How can I merge two git branches?"),
            ("What does API stand for?", "What is API short for?"),
            ("How do I clear my browser cache?", "How can I clear the cache of my browser?"),
            (
                "How do I invite a teammate to the workspace?",
                "How can I invite a teammate to my workspace?",
            ),
            (
                "What is the warranty period for this laptop?",
                "How long is the warranty for this laptop?",
            ),
            ("How do I read a CSV file in pandas?", "How can I read a CSV file with pandas?"),
            ("What causes inflation?", "What are the causes of inflation?"),
            ("How do I reset the router?", "How can I reset my router?"),
            ("How do I write a cover letter?", "How should I write a cover letter?"),
            (
                "What is the time complexity of binary search?",
                "What's the time complexity of a binary search?",
            ),
            (
                "How do I convert a string to an integer in Java?",
                "How can I convert a string into an integer in Java?",
            ),
            ("Where is my invoice?", "Where can I find my invoice?"),
            ("How do I change my username?", "Can I change my username? How?"),
            ("What is the population of Canada?", "How many people live in Canada?"),
            ("How do I center a div in CSS?", "How can I center a div with CSS?"),
            (
                "What is the best way to store passwords in a database?",
                "What's the best way to store passwords in a database?",
            ),
            ("How do I join a meeting from my phone?", "How can I join a meeting on my phone?"),
        ],
    ),
    (
        "en_paraphrase_reworded",
        True,
        [
            ("How do I reset my password?", "I forgot my password, how do I reset it?"),
            ("How do I cancel my subscription?", "What are the steps to cancel my subscription?"),
            ("What payment methods do you accept?", "Which ways can I pay?"),
            ("How long does delivery take?", "When will my delivery arrive, usually?"),
            ("Can I get a refund?", "Is it possible to get my money back?"),
            ("How do I contact support?", "What is the best way to reach your support team?"),
            ("What is the capital of Japan?", "Which city is Japan's capital?"),
            ("How do I learn to code?", "What's the best way to start learning programming?"),
            ("How can I improve my sleep?", "What can I do to sleep better?"),
            ("What is the meaning of life?", "What's life's meaning?"),
            ("How do I make pancakes?", "What's a recipe for pancakes?"),
            ("How do I lose weight?", "What's the best way to lose weight?"),
            ("How do I change my profile picture?", "How do I update my avatar?"),
            ("Why is my internet slow?", "What makes my internet connection so slow?"),
            ("How do I write a good resume?", "Any tips for writing a good resume?"),
            ("What is blockchain?", "Explain blockchain to me."),
            (
                "How do I install Docker on Ubuntu?",
                "What are the steps to install Docker on Ubuntu?",
            ),
            ("How do I reverse a string in Python?", "What's the way to reverse a Python string?"),
            ("How do I quit smoking?", "What's the best way to stop smoking?"),
            ("How do I become a data scientist?", "What does it take to become a data scientist?"),
            (
                "What is the distance from the Earth to the Moon?",
                "How far away is the Moon from Earth?",
            ),
            (
                "How do I remove a virus from my computer?",
                "How can I get rid of a virus on my computer?",
            ),
            ("How do I save money?", "What are good ways to save money?"),
            ("What are the symptoms of diabetes?", "What are the signs of diabetes?"),
            ("How do I apply for a passport?", "What is the process to apply for a passport?"),
            ("How do I upgrade my plan?", "I want to upgrade my plan, how do I do that?"),
            ("How do I report a bug?", "Where do I report a bug?"),
            ("How can I speed up my laptop?", "How do I make my laptop faster?"),
            (
                "How do I take a screenshot on a Mac?",
                "What's the way to take a screenshot on a Mac?",
            ),
            (
                "What is the difference between weather and climate?",
                "How is weather different from climate?",
            ),
            ("How do I boil an egg?", "What's the best way to boil an egg?"),
            (
                "How do I set up a new email account?",
                "What are the steps to set up a new email account?",
            ),
        ],
    ),
    (
        "zh_paraphrase_reworded",
        True,
        [
            ("怎么重置密码？", "我忘记密码了，怎么重置？"),
            ("怎么取消订阅？", "取消订阅的步骤是什么？"),
            ("支持哪些付款方式？", "可以用哪些方式付款？"),
            ("多久能收到货？", "一般多久能收到货？"),
            ("可以退款吗？", "能把钱退给我吗？"),
            ("怎么联系客服？", "客服怎么联系？"),
            ("日本的首都是哪里？", "日本首都是哪个城市？"),
            ("怎么提高睡眠质量？", "如何让睡眠质量变好？"),
            ("怎么做煎饼？", "煎饼的做法是什么？"),
            ("怎么减肥？", "减肥有什么好方法？"),
            ("怎么修改头像？", "头像在哪里修改？"),
            ("为什么网速很慢？", "网速慢是什么原因？"),
            ("怎么写简历？", "简历应该怎么写？"),
            ("什么是区块链？", "解释一下区块链。"),
            ("怎么戒烟？", "如何才能戒掉烟？"),
            ("怎么申请护照？", "申请护照的流程是什么？"),
            ("怎么升级套餐？", "我想升级套餐，怎么操作？"),
            ("怎么截图？", "截图的方法是什么？"),
            ("怎么存钱？", "有什么存钱的好方法？"),
            ("糖尿病有哪些症状？", "糖尿病的症状有哪些？"),
            ("月球离地球多远？", "地球到月球的距离是多少？"),
            ("怎么让电脑变快？", "电脑太慢了怎么提速？"),
        ],
    ),
    (
        "en_near_repeat",
        True,
        [
            ("how do i reset my password", "How do I reset my password?"),
            ("What is the capital of France?", "what is the capital of france"),
            ("How do I cancel my order?", "How do I cancel my order"),
            ("WHAT ARE YOUR OPENING HOURS?", "What are your opening hours?"),
            ("How do I   change my plan?", "How do I change my plan?"),
            ("What is Docker?", "what is docker?"),
            ("Can I pay with PayPal?", "Can I pay with PayPal??"),
            ("How do I log in?", "How do I log in ?"),
            ("What's the refund policy?", "What is the refund policy?"),
            ("How do I install Node.js on Ubuntu?", "how do I install Node.js on Ubuntu?"),
            ("Where is the nearest station?", "where's the nearest station?"),
            ("Is the app free?", "Is the app free ?"),
            ("How do I export a PDF?", "How do I export a PDF!"),
            ("Do you have a student discount?", "Do you have a student discount ?"),
            ("How do I turn off notifications?", "how do I turn off notifications"),
            ("What is Kubernetes used for?", "What is Kubernetes used for ?"),
            ("I can't log in to my account", "I cannot log in to my account"),
            ("How do I change my password?", "How do I change my password? thanks"),
            ("What time does the store open?", "what time does the store open?"),
            ("How do I add a user?", "How do I add a user??"),
            (
                "What is the weather like in Tokyo in spring?",
                "What is the weather like in Tokyo in spring",
            ),
            ("Why won't my laptop turn on?", "Why won't my laptop turn on"),
            ("How do I book a table?", "How do I book a table."),
            ("How do I get a receipt?", "how do i get a receipt?"),
            ("What is a mortgage?", "what's a mortgage?"),
            ("How do I connect to the VPN?", "How do I connect to the VPN ?"),
            ("What is the Wi-Fi password?", "what is the wi-fi password?"),
            ("How do I reset my PIN?", "How do I reset my PIN"),
            ("Can I change my delivery address?", "can I change my delivery address"),
            ("How do I recover a deleted file?", "How do I recover a deleted file ?"),
        ],
    ),
    (
        "en_negation",
        False,
        [
            (
                "Is it safe to take aspirin with ibuprofen?",
                "Is it unsafe to take aspirin with ibuprofen?",
            ),
            ("Why is my payment going through?", "Why is my payment not going through?"),
            (
                "Should I take this medicine with food?",
                "Should I not take this medicine with food?",
            ),
            ("Can I use my card abroad?", "Can't I use my card abroad?"),
            (
                "What happens if I pay my bill on time?",
                "What happens if I don't pay my bill on time?",
            ),
            ("Is this product available in stores?", "Is this product unavailable in stores?"),
            ("Why does my phone charge?", "Why does my phone not charge?"),
            ("Is it legal to record a phone call?", "Is it illegal to record a phone call?"),
            ("Which foods are healthy for dogs?", "Which foods are unhealthy for dogs?"),
            ("Is the password valid?", "Is the password invalid?"),
            ("Why is the email delivered?", "Why is the email not delivered?"),
            ("Is my account verified?", "Is my account unverified?"),
            ("Can pregnant women drink coffee?", "Can pregnant women never drink coffee?"),
            ("Is the link secure?", "Is the link insecure?"),
            (
                "What should I do when the app responds?",
                "What should I do when the app is not responding?",
            ),
            ("Is it possible to transfer my license?", "Is it impossible to transfer my license?"),
            ("Why is my order complete?", "Why is my order incomplete?"),
            (
                "Is the update compatible with Windows 10?",
                "Is the update incompatible with Windows 10?",
            ),
            ("Do I need a visa to visit Japan?", "Do I not need a visa to visit Japan?"),
            ("Is this mushroom edible?", "Is this mushroom inedible?"),
        ],
    ),
    (
        "en_antonym",
        False,
        [
            ("How do I enable dark mode?", "How do I disable dark mode?"),
            ("How do I increase the font size?", "How do I decrease the font size?"),
            ("What is the best time to buy a stock?", "What is the best time to sell a stock?"),
            ("Should I take the pill before meals?", "Should I take the pill after meals?"),
            ("How do I upload a file to the server?", "How do I download a file from the server?"),
            ("How do I add a member to the group?", "How do I remove a member from the group?"),
            ("How do I start the service?", "How do I stop the service?"),
            ("What is the maximum file size?", "What is the minimum file size?"),
            ("How do I encrypt a file?", "How do I decrypt a file?"),
            ("How do I install the printer driver?", "How do I uninstall the printer driver?"),
            ("How do I import contacts?", "How do I export contacts?"),
            ("How do I lock my screen?", "How do I unlock my screen?"),
            (
                "What are the advantages of remote work?",
                "What are the disadvantages of remote work?",
            ),
            ("How do I turn on Bluetooth?", "How do I turn off Bluetooth?"),
            ("Which is the cheapest plan?", "Which is the most expensive plan?"),
            ("How do I subscribe to the channel?", "How do I unsubscribe from the channel?"),
        ],
    ),
    (
        "en_entity_swap",
        False,
        [
            ("What's the weather in Paris tomorrow?", "What's the weather in London tomorrow?"),
            ("How do I install Python on Windows?", "How do I install Python on macOS?"),
            ("What is the capital of Austria?", "What is the capital of Australia?"),
            ("How much does the iPhone 15 cost?", "How much does the Pixel 8 cost?"),
            ("Who is the CEO of Microsoft?", "Who is the CEO of Google?"),
            ("How do I sort a list in Python?", "How do I sort a list in Java?"),
            ("What time is it in Tokyo?", "What time is it in Sydney?"),
            ("How far is Berlin from Munich?", "How far is Berlin from Hamburg?"),
            ("Does Visa work in China?", "Does Mastercard work in China?"),
            (
                "How do I connect AirPods to a Samsung phone?",
                "How do I connect AirPods to a Huawei phone?",
            ),
            ("What is the population of Brazil?", "What is the population of Argentina?"),
            ("How do I deploy to AWS?", "How do I deploy to Azure?"),
            (
                "Who won the 2018 World Cup, France or Croatia?",
                "Who won the 2018 World Cup, France or Belgium?",
            ),
            (
                "What is the exchange rate from USD to EUR?",
                "What is the exchange rate from USD to GBP?",
            ),
            ("How do I use Excel's VLOOKUP?", "How do I use Google Sheets' VLOOKUP?"),
            ("Is Netflix available in India?", "Is Netflix available in Russia?"),
            ("What is the tallest mountain in Africa?", "What is the tallest mountain in Europe?"),
            (
                "How do I migrate from MySQL to PostgreSQL?",
                "How do I migrate from MySQL to MongoDB?",
            ),
            ("Can I fly from Boston to Chicago today?", "Can I fly from Boston to Denver today?"),
            ("How do I open a bank account at Chase?", "How do I open a bank account at Barclays?"),
            ("What are the symptoms of flu?", "What are the symptoms of COVID?"),
            ("How do I use React hooks?", "How do I use Vue hooks?"),
        ],
    ),
    (
        "en_number_change",
        False,
        [
            ("Track order 48213", "Track order 48231"),
            ("What is 15% of 200?", "What is 15% of 300?"),
            ("Is 97 a prime number?", "Is 91 a prime number?"),
            ("How much is a 2-night stay?", "How much is a 3-night stay?"),
            ("Can a child under 12 fly alone?", "Can a child under 16 fly alone?"),
            ("What is the status of ticket #1042?", "What is the status of ticket #1024?"),
            ("Convert 100 USD to EUR", "Convert 1000 USD to EUR"),
            (
                "How many grams of protein should a 70 kg person eat?",
                "How many grams of protein should a 90 kg person eat?",
            ),
            ("What happened in 1989?", "What happened in 1998?"),
            ("Is a 500 mg dose of ibuprofen safe?", "Is an 800 mg dose of ibuprofen safe?"),
            ("What is the square root of 144?", "What is the square root of 169?"),
            ("Where is flight LH 400?", "Where is flight LH 404?"),
            ("How do I get to gate 12?", "How do I get to gate 21?"),
            ("Can I return it within 14 days?", "Can I return it within 30 days?"),
            ("What does error code 0x80070005 mean?", "What does error code 0x80070057 mean?"),
            (
                "How long does it take to boil two eggs?",
                "How long does it take to boil three eggs?",
            ),
        ],
    ),
    (
        "en_date_change",
        False,
        [
            ("Is the museum open on Monday?", "Is the museum open on Sunday?"),
            ("What's the weather today?", "What's the weather tomorrow?"),
            (
                "Are there any flights to Rome in July?",
                "Are there any flights to Rome in December?",
            ),
            ("What were the sales figures for 2022?", "What were the sales figures for 2023?"),
            (
                "Is the office open on Christmas Eve morning?",
                "Is the office open on Christmas Eve evening?",
            ),
            ("What events are happening this weekend?", "What events are happening next weekend?"),
            ("Is the bank open on Saturday?", "Is the bank open on Friday?"),
            ("What was the closing price yesterday?", "What was the closing price today?"),
            (
                "When is the deadline for the March invoice?",
                "When is the deadline for the April invoice?",
            ),
            ("Is it cold in Norway in winter?", "Is it cold in Norway in summer?"),
            ("Do trains run at night?", "Do trains run in the morning?"),
            ("Is the pool open on Tuesday afternoon?", "Is the pool open on Thursday afternoon?"),
        ],
    ),
    (
        "en_scope_change",
        False,
        [
            ("How do I delete my files?", "How do I delete all files?"),
            ("Can kids take ibuprofen?", "Can adults take ibuprofen?"),
            (
                "What is the average salary of an engineer?",
                "What is the total salary of an engineer?",
            ),
            ("How do I share a document with my team?", "How do I share a document with everyone?"),
            ("Does the plan include some updates?", "Does the plan include all updates?"),
            ("How do I export this page?", "How do I export every page?"),
            (
                "Is the discount valid for new customers only?",
                "Is the discount valid for all customers?",
            ),
            ("How much does one ticket cost?", "How much do all tickets cost?"),
            ("Can I cancel one item of my order?", "Can I cancel my entire order?"),
            ("How do I make my repository private?", "How do I make my repository public?"),
            ("What is the personal plan price?", "What is the team plan price?"),
            ("Is this medicine safe for children?", "Is this medicine safe for pregnant women?"),
        ],
    ),
    (
        "zh_paraphrase",
        True,
        [
            ("怎么重置密码？", "如何重置密码？"),
            ("怎么取消订阅？", "如何取消订阅？"),
            ("退货政策是什么？", "什么是退货政策？"),
            ("怎样联系客服？", "如何联系客服？"),
            ("请问怎么修改邮箱？", "怎么修改邮箱？"),
            ("你们支持哪些付款方式？", "您们支持哪些付款方式？"),
            ("怎么删除我的账户？", "如何删除账户？"),
            ("可以开发票吗？", "能开发票吗？"),
            ("怎么下载手机应用？", "如何下载手机应用？"),
            ("今天北京天气怎么样？", "北京今天天气如何？"),
            ("为什么天空是蓝色的？", "为何天空是蓝色的？"),
            ("怎么更改收货地址？", "如何修改收货地址？"),
            ("什么是机器学习？", "机器学习是什么？"),
            ("有免费试用吗？", "请问有免费试用吗？"),
            ("怎么开启两步验证？", "如何开启两步验证？"),
            ("运费多少钱？", "运费的价格是多少？"),
            ("能不能退款？", "可以退款吗？"),
            ("怎么导出数据？", "怎样导出数据？"),
            ("怎么查看物流信息？", "如何查看物流信息？"),
            ("怎么修改用户名？", "如何更改用户名？"),
            ("营业时间是几点到几点？", "请问营业时间是几点到几点？"),
            ("怎么绑定银行卡？", "如何绑定银行卡呢？"),
            ("为啥我收不到验证码？", "为什么我收不到验证码？"),
            ("怎么邀请同事加入工作区？", "如何邀请同事加入工作区？"),
            ("怎么清除浏览器缓存？", "如何清除浏览器的缓存？"),
            ("会员有什么权益？", "会员有啥权益？"),
            ("怎么申请售后？", "请问如何申请售后？"),
            ("怎么修改登录密码？", "如何更改登录密码？"),
            ("光速是多少？", "请问光速是多少？"),
            ("怎么查询订单状态？", "如何查询订单状态？"),
            ("怎么关闭自动续费？", "如何关闭自动续费？"),
            ("可以用支付宝付款吗？", "能用支付宝付款吗？"),
            ("怎么设置默认地址？", "如何设置默认地址呢？"),
            ("Python怎么读取CSV文件？", "Python如何读取CSV文件？"),
            ("怎么学好英语？", "如何学好英语？"),
            ("什么是通货膨胀？", "通货膨胀是什么？"),
            ("怎么申请退款？", "如何申请退款？"),
        ],
    ),
    (
        "zh_near_repeat",
        True,
        [
            ("怎么重置密码", "怎么重置密码？"),
            ("如何联系客服？", "如何联系客服？？"),
            ("运费是多少？", "运费是多少?"),
            ("有学生优惠吗", "有学生优惠吗？"),
            ("怎么退货？", "怎么退货？谢谢"),
            ("支持货到付款吗？", "支持货到付款吗?"),
            ("怎么修改昵称？", "怎么修改昵称 ？"),
            ("APP是免费的吗？", "app是免费的吗？"),
            ("怎么注销账号？", "怎么注销账号"),
            ("发货要多久？", "发货要多久？？"),
            ("怎么连接VPN？", "怎么连接vpn？"),
            ("Wi-Fi密码是什么？", "wi-fi密码是什么？"),
            ("怎么开通会员？", "怎么开通会员。"),
            ("在哪里下载发票？", "在哪里下载发票?"),
            ("怎么更换头像？", "怎么更换头像？！"),
            ("你们几点开门？", "你们几点开门"),
            ("怎么找回密码？", "请问怎么找回密码？"),
            ("怎么添加好友？", "怎么添加好友呢？"),
            ("可以改签吗？", "可以改签吗"),
            ("订单什么时候发货？", "订单什么时候发货?"),
        ],
    ),
    (
        "zh_negation",
        False,
        [
            ("阿司匹林和布洛芬一起吃安全吗？", "阿司匹林和布洛芬一起吃不安全吗？"),
            ("为什么我的付款成功了？", "为什么我的付款没有成功？"),
            ("这个药饭后吃吗？", "这个药不饭后吃吗？"),
            ("为什么手机能充电？", "为什么手机不能充电？"),
            ("我的账号已经验证了吗？", "我的账号还未验证吗？"),
            ("这个产品有库存吗？", "这个产品没有库存吗？"),
            ("为什么邮件发送成功？", "为什么邮件发送不成功？"),
            ("孕妇可以喝咖啡吗？", "孕妇不可以喝咖啡吗？"),
            ("去日本需要签证吗？", "去日本不需要签证吗？"),
            ("这个蘑菇能吃吗？", "这个蘑菇不能吃吗？"),
            ("为什么应用有响应？", "为什么应用无响应？"),
            ("录音是合法的吗？", "录音是不合法的吗？"),
            ("这个链接安全吗？", "这个链接不安全吗？"),
            ("为什么订单完成了？", "为什么订单未完成？"),
            ("狗可以吃葡萄吗？", "狗不可以吃葡萄吗？"),
        ],
    ),
    (
        "zh_antonym",
        False,
        [
            ("怎么开启深色模式？", "怎么关闭深色模式？"),
            ("怎么增加字体大小？", "怎么减少字体大小？"),
            ("什么时候买股票最好？", "什么时候卖股票最好？"),
            ("这个药饭前吃好吗？", "这个药饭后吃好吗？"),
            ("怎么上传文件？", "怎么下载文件？"),
            ("怎么添加群成员？", "怎么删除群成员？"),
            ("怎么加密文件？", "怎么解密文件？"),
            ("怎么安装打印机驱动？", "怎么卸载打印机驱动？"),
            ("怎么导入联系人？", "怎么导出联系人？"),
            ("远程办公有什么优点？", "远程办公有什么缺点？"),
            ("最便宜的套餐是哪个？", "最贵的套餐是哪个？"),
            ("怎么锁定屏幕？", "怎么解锁屏幕？"),
        ],
    ),
    (
        "zh_entity_swap",
        False,
        [
            ("北京今天天气怎么样？", "上海今天天气怎么样？"),
            ("Windows怎么安装Python？", "Mac怎么安装Python？"),
            ("iPhone 15多少钱？", "华为Mate 60多少钱？"),
            ("微软的CEO是谁？", "谷歌的CEO是谁？"),
            ("从北京到广州怎么走？", "从北京到深圳怎么走？"),
            ("支付宝怎么提现？", "微信怎么提现？"),
            ("日本的首都是哪里？", "韩国的首都是哪里？"),
            ("招商银行怎么开户？", "工商银行怎么开户？"),
            ("杭州有什么好玩的？", "苏州有什么好玩的？"),
            ("淘宝怎么退货？", "京东怎么退货？"),
            ("流感有什么症状？", "新冠有什么症状？"),
            ("长城有多长？", "长江有多长？"),
            ("怎么用Excel做图表？", "怎么用WPS做图表？"),
            ("成都到重庆高铁多久？", "成都到西安高铁多久？"),
            ("李白是哪个朝代的？", "杜甫是哪个朝代的？"),
        ],
    ),
    (
        "zh_number_change",
        False,
        [
            ("查询订单48213", "查询订单48231"),
            ("200的15%是多少？", "300的15%是多少？"),
            ("住两晚多少钱？", "住三晚多少钱？"),
            ("12岁以下儿童可以单独乘机吗？", "16岁以下儿童可以单独乘机吗？"),
            ("工单1042的状态是什么？", "工单1024的状态是什么？"),
            ("100美元是多少人民币？", "1000美元是多少人民币？"),
            ("1989年发生了什么？", "1998年发生了什么？"),
            ("布洛芬一次吃500毫克安全吗？", "布洛芬一次吃800毫克安全吗？"),
            ("12号登机口怎么走？", "21号登机口怎么走？"),
            ("七天内可以退货吗？", "三十天内可以退货吗？"),
            ("煮两个鸡蛋要多久？", "煮三个鸡蛋要多久？"),
            ("二十三路公交几点收车？", "三十二路公交几点收车？"),
        ],
    ),
    (
        "zh_date_change",
        False,
        [
            ("博物馆周一开门吗？", "博物馆周日开门吗？"),
            ("今天天气怎么样？", "明天天气怎么样？"),
            ("七月有去罗马的航班吗？", "十二月有去罗马的航班吗？"),
            ("2022年的销售额是多少？", "2023年的销售额是多少？"),
            ("银行周六营业吗？", "银行周五营业吗？"),
            ("昨天的收盘价是多少？", "今天的收盘价是多少？"),
            ("这周末有什么活动？", "下周末有什么活动？"),
            ("挪威冬天冷吗？", "挪威夏天冷吗？"),
            ("地铁晚上几点停运？", "地铁早上几点停运？"),
            ("游泳池周二下午开放吗？", "游泳池周四下午开放吗？"),
        ],
    ),
    (
        "zh_scope_change",
        False,
        [
            ("怎么删除我的文件？", "怎么删除所有文件？"),
            ("儿童可以吃布洛芬吗？", "成人可以吃布洛芬吗？"),
            ("工程师的平均工资是多少？", "工程师的总工资是多少？"),
            ("怎么把文档分享给团队？", "怎么把文档分享给所有人？"),
            ("这个优惠只限新用户吗？", "这个优惠适用于全部用户吗？"),
            ("怎么导出这一页？", "怎么导出每一页？"),
            ("一张票多少钱？", "全部票多少钱？"),
            ("怎么把仓库设为私有？", "怎么把仓库设为公开？"),
            ("个人版多少钱？", "团队版多少钱？"),
            ("这个药孕妇能吃吗？", "这个药老人能吃吗？"),
        ],
    ),
]


def u(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def s(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# Conversations: shared openings, then follow-ups. A follow-up only means the same thing after
# the same (or an equivalent) conversation.
ORDER_A = [
    u("I ordered a blue jacket last week, order 48213."),
    s("I found order 48213: one blue jacket, shipped on Monday."),
]
ORDER_B = [
    u("I ordered running shoes yesterday, order 77120."),
    s("I found order 77120: running shoes, not shipped yet."),
]
SUB_A = [u("I have the Pro plan subscription."), s("You are on the Pro plan, billed monthly.")]
SUB_B = [u("I have the Family plan subscription."), s("You are on the Family plan, billed yearly.")]
TRIP_A = [u("I'm planning a trip to Paris in May."), s("Paris in May is mild, around 15-20 °C.")]
TRIP_B = [
    u("I'm planning a trip to Oslo in January."),
    s("Oslo in January is cold, often below 0 °C."),
]
MED_A = [u("I take ibuprofen for back pain."), s("Ibuprofen is an NSAID often used for back pain.")]
MED_B = [
    u("I take warfarin for my heart."),
    s("Warfarin is a blood thinner that needs regular monitoring."),
]
CODE_A = [
    u("I'm writing a web server in Python with Flask."),
    s("Flask is a lightweight Python web framework."),
]
CODE_B = [
    u("I'm writing a web server in Go with net/http."),
    s("Go's net/http package includes a production-ready server."),
]
ZH_ORDER_A = [
    u("我上周买了一件蓝色外套，订单号48213。"),
    s("找到订单48213：蓝色外套一件，周一已发货。"),
]
ZH_ORDER_B = [u("我昨天买了一双跑鞋，订单号77120。"), s("找到订单77120：跑鞋一双，尚未发货。")]
ZH_TRIP_A = [u("我打算五月去巴黎旅游。"), s("巴黎五月气候温和，大约15到20度。")]
ZH_TRIP_B = [u("我打算一月去哈尔滨旅游。"), s("哈尔滨一月非常冷，常在零下20度以下。")]

CONVERSATIONS: list[tuple[str, bool, list[tuple[list[dict[str, str]], list[dict[str, str]]]]]] = [
    (
        "conv_same_context_paraphrase",
        True,
        [
            (ORDER_A + [u("Can you cancel it?")], ORDER_A + [u("Could you cancel it?")]),
            (ORDER_A + [u("When will it arrive?")], ORDER_A + [u("When is it going to arrive?")]),
            (SUB_A + [u("How do I cancel it?")], SUB_A + [u("How can I cancel it?")]),
            (SUB_A + [u("What does it include?")], SUB_A + [u("What does it include")]),
            (TRIP_A + [u("What should I pack?")], TRIP_A + [u("What should I pack for it?")]),
            (TRIP_A + [u("Do I need an umbrella?")], TRIP_A + [u("Will I need an umbrella?")]),
            (
                MED_A + [u("Can I drink alcohol with it?")],
                MED_A + [u("Is it ok to drink alcohol with it?")],
            ),
            (
                MED_A + [u("What is the maximum daily dose?")],
                MED_A + [u("What's the maximum daily dose?")],
            ),
            (CODE_A + [u("How do I add a route?")], CODE_A + [u("How can I add a route?")]),
            (
                CODE_A + [u("How do I run it in production?")],
                CODE_A + [u("How do I run it in production")],
            ),
            (ZH_ORDER_A + [u("能取消吗？")], ZH_ORDER_A + [u("可以取消吗？")]),
            (ZH_ORDER_A + [u("什么时候到？")], ZH_ORDER_A + [u("请问什么时候到？")]),
            (ZH_TRIP_A + [u("应该带什么衣服？")], ZH_TRIP_A + [u("应该带什么衣服呢？")]),
            (ZH_TRIP_A + [u("需要带伞吗？")], ZH_TRIP_A + [u("需要带伞吗")]),
            (SUB_A + [u("How much does it cost?")], SUB_A + [u("How much does it cost")]),
            (CODE_A + [u("How do I handle errors?")], CODE_A + [u("How can I handle errors?")]),
            (ORDER_A + [u("Where is it now?")], ORDER_A + [u("Where is it right now?")]),
            (
                MED_A + [u("Can I take it on an empty stomach?")],
                MED_A + [u("Can I take it on an empty stomach")],
            ),
            (ZH_TRIP_A + [u("那里有什么好吃的？")], ZH_TRIP_A + [u("那里有什么好吃的")]),
            (TRIP_A + [u("Is it crowded then?")], TRIP_A + [u("Is it crowded then")]),
        ],
    ),
    (
        "conv_equivalent_context",
        True,
        [
            (
                [
                    u("I ordered a blue jacket last week, order 48213"),
                    ORDER_A[1],
                    u("Can you cancel it?"),
                ],
                ORDER_A + [u("Can you cancel it?")],
            ),
            (
                [u("i'm planning a trip to Paris in May."), TRIP_A[1], u("What should I pack?")],
                TRIP_A + [u("What should I pack?")],
            ),
            (
                [u("I take ibuprofen for back pain"), MED_A[1], u("Can I drink alcohol with it?")],
                MED_A + [u("Can I drink alcohol with it?")],
            ),
            (
                [u("I have the Pro plan subscription"), SUB_A[1], u("How do I cancel it?")],
                SUB_A + [u("How do I cancel it?")],
            ),
            (
                [u("我上周买了一件蓝色外套，订单号48213"), ZH_ORDER_A[1], u("能取消吗？")],
                ZH_ORDER_A + [u("能取消吗？")],
            ),
            (
                [
                    u("I'm writing a web server in Python with Flask"),
                    CODE_A[1],
                    u("How do I add a route?"),
                ],
                CODE_A + [u("How do I add a route?")],
            ),
            (
                [u("I'm planning a trip to Paris in May!"), TRIP_A[1], u("Do I need an umbrella?")],
                TRIP_A + [u("Do I need an umbrella?")],
            ),
            (
                [u("I have the Pro plan subscription."), SUB_A[1], u("What does it include?")],
                SUB_A + [u("what does it include?")],
            ),
        ],
    ),
    (
        "conv_followup_other_context",
        False,
        [
            (ORDER_A + [u("Can you cancel it?")], ORDER_B + [u("Can you cancel it?")]),
            (ORDER_A + [u("When will it arrive?")], ORDER_B + [u("When will it arrive?")]),
            (SUB_A + [u("How do I cancel it?")], SUB_B + [u("How do I cancel it?")]),
            (SUB_A + [u("What does it include?")], SUB_B + [u("What does it include?")]),
            (TRIP_A + [u("What should I pack?")], TRIP_B + [u("What should I pack?")]),
            (TRIP_A + [u("Do I need an umbrella?")], TRIP_B + [u("Do I need an umbrella?")]),
            (
                MED_A + [u("Can I drink alcohol with it?")],
                MED_B + [u("Can I drink alcohol with it?")],
            ),
            (
                MED_A + [u("What is the maximum daily dose?")],
                MED_B + [u("What is the maximum daily dose?")],
            ),
            (CODE_A + [u("How do I add a route?")], CODE_B + [u("How do I add a route?")]),
            (
                CODE_A + [u("How do I run it in production?")],
                CODE_B + [u("How do I run it in production?")],
            ),
            (ZH_ORDER_A + [u("能取消吗？")], ZH_ORDER_B + [u("能取消吗？")]),
            (ZH_ORDER_A + [u("什么时候到？")], ZH_ORDER_B + [u("什么时候到？")]),
            (ZH_TRIP_A + [u("应该带什么衣服？")], ZH_TRIP_B + [u("应该带什么衣服？")]),
            (ZH_TRIP_A + [u("需要带伞吗？")], ZH_TRIP_B + [u("需要带伞吗？")]),
            (SUB_A + [u("How much does it cost?")], SUB_B + [u("How much does it cost?")]),
            (CODE_A + [u("How do I handle errors?")], CODE_B + [u("How do I handle errors?")]),
            (ORDER_A + [u("Can you cancel it?")], [u("Can you cancel it?")]),
            (TRIP_A + [u("What should I pack?")], [u("What should I pack?")]),
            (MED_A + [u("Can I drink alcohol with it?")], [u("Can I drink alcohol with it?")]),
            (ZH_ORDER_A + [u("能取消吗？")], [u("能取消吗？")]),
            (SUB_A + [u("How do I cancel it?")], TRIP_A + [u("How do I cancel it?")]),
            (ORDER_A + [u("Can you cancel it?")], SUB_A + [u("Can you cancel it?")]),
        ],
    ),
    (
        "conv_context_detail_change",
        False,
        [
            (
                ORDER_A + [u("Can you cancel it?")],
                [
                    u("I ordered a blue jacket last week, order 48231."),
                    s("I found order 48231: one blue jacket, shipped on Monday."),
                    u("Can you cancel it?"),
                ],
            ),
            (
                TRIP_A + [u("What should I pack?")],
                [
                    u("I'm planning a trip to Paris in December."),
                    s("Paris in December is cold, around 3-8 °C."),
                    u("What should I pack?"),
                ],
            ),
            (
                TRIP_A + [u("What should I pack?")],
                [
                    u("I'm planning a trip to Rome in May."),
                    s("Rome in May is warm, around 18-25 °C."),
                    u("What should I pack?"),
                ],
            ),
            (
                MED_A + [u("Can I drink alcohol with it?")],
                [
                    u("I take paracetamol for back pain."),
                    s("Paracetamol is a common pain reliever."),
                    u("Can I drink alcohol with it?"),
                ],
            ),
            (
                SUB_A + [u("How much does it cost?")],
                [
                    u("I have the Basic plan subscription."),
                    s("You are on the Basic plan, billed monthly."),
                    u("How much does it cost?"),
                ],
            ),
            (
                CODE_A + [u("How do I add a route?")],
                [
                    u("I'm writing a web server in Python with Django."),
                    s("Django is a full-featured Python web framework."),
                    u("How do I add a route?"),
                ],
            ),
            (
                ZH_ORDER_A + [u("能取消吗？")],
                [
                    u("我上周买了一件红色外套，订单号48213。"),
                    s("找到订单48213：红色外套一件，周一已发货。"),
                    u("能取消吗？"),
                ],
            ),
            (
                ZH_TRIP_A + [u("应该带什么衣服？")],
                [
                    u("我打算五月去伦敦旅游。"),
                    s("伦敦五月气候温和，大约12到18度。"),
                    u("应该带什么衣服？"),
                ],
            ),
            (
                MED_A + [u("What is the maximum daily dose?")],
                [
                    u("I take ibuprofen for my child's fever."),
                    s("Ibuprofen is an NSAID often used for fever."),
                    u("What is the maximum daily dose?"),
                ],
            ),
            (
                ORDER_A + [u("When will it arrive?")],
                [
                    u("I ordered a blue jacket last week, order 48213."),
                    s("I found order 48213: one blue jacket, not shipped yet."),
                    u("When will it arrive?"),
                ],
            ),
            (
                SUB_A + [u("How do I cancel it?")],
                [
                    u("I have the Pro plan subscription."),
                    s("You are on the Pro plan, billed yearly."),
                    u("How do I cancel it?"),
                ],
            ),
            (
                TRIP_A + [u("Do I need an umbrella?")],
                [
                    u("I'm planning a trip to Paris in November."),
                    s("Paris in November is rainy, around 5-10 °C."),
                    u("Do I need an umbrella?"),
                ],
            ),
            (ORDER_A + [u("Where is it now?")], ORDER_B + [u("Where is it now?")]),
            (
                MED_A + [u("Can I take it on an empty stomach?")],
                MED_B + [u("Can I take it on an empty stomach?")],
            ),
            (ZH_TRIP_A + [u("那里有什么好吃的？")], ZH_TRIP_B + [u("那里有什么好吃的？")]),
            (TRIP_A + [u("Is it crowded then?")], TRIP_B + [u("Is it crowded then?")]),
        ],
    ),
]


def main() -> None:
    with open(HERE / "questions.jsonl", "w", encoding="utf-8") as fh:
        for category, same, pairs in QUESTIONS:
            for a, b in pairs:
                row = {"a": a, "b": b, "same_answer": same, "category": category}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(HERE / "conversations.jsonl", "w", encoding="utf-8") as fh:
        for category, same, convs in CONVERSATIONS:
            for a, b in convs:
                row = {"a": a, "b": b, "same_answer": same, "category": category}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
